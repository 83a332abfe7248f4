#!/usr/bin/env bash
# README command 1: install what is needed, then build the website from committed outputs, in
# English and in Chinese (tools/i18n.py: the same notebooks, prose from locales/zh_CN).
#   bash tools/book.sh                      # -> _build/html/index.html and _build/html/zh/index.html
#   bash tools/book.sh --toc /tmp/toc.yml   # extra arguments go to `jupyter-book build`
#   SKIP_INSTALL=1 bash tools/book.sh       # rebuild without re-running tools/install.sh
#   SKIP_PDF=1 bash tools/book.sh           # the website only, without the whole-book PDF
# Then, where Chromium is installed, tools/pdf.py prints the whole book to
# _build/html/backprop-by-hand.pdf and _build/html/zh/backprop-by-hand.pdf, which the landing
# pages link (a few minutes each).
# The site is self-contained (works offline): tools/web/vendor.py installs the pinned npm
# packages (npm ci) and copies MathJax and the Jupyter widgets JavaScript into _build/offline/,
# which _config.yml hands to Sphinx (html_extra_path).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ "${SKIP_INSTALL:-0}" != 1 ]; then
  bash tools/install.sh
fi
start=$(date +%s)
"$PY" tools/web/vendor.py
rm -rf _build/html
# -W: any warning fails the build; -n: so does a broken cross-reference.
"$PY" -c "import sys; from jupyter_book.cli.main import main; sys.argv[0] = 'jupyter-book'; main()" \
  build -W -n --keep-going "$@" .
echo "Website built in $(( $(date +%s) - start ))s: $(pwd)/_build/html/index.html"
# the Chinese edition, beside it (the same -W -n: any warning fails), and its coverage
"$PY" tools/i18n.py build
"$PY" tools/i18n.py coverage
if [ "${SKIP_PDF:-0}" != 1 ]; then
  if [ -x "${CHROMIUM:-/usr/bin/chromium}" ]; then
    "$PY" tools/pdf.py
    "$PY" tools/pdf.py --language zh_CN
  else
    echo "No Chromium: the whole-book PDF was not built (apt-get install chromium, or set CHROMIUM=...)"
  fi
fi
