"""Backprop by Hand: tested helpers for the course notebooks.

Import the submodule you need, e.g. ``from helpers.show import show``.
Nothing is imported here so that math modules stay headless and fast.
"""

__version__ = "0.1.0"
