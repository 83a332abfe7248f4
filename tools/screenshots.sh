#!/usr/bin/env bash
# Retake the review screenshots committed under screenshots/: the landing page, chapters 1, 4,
# 6, 10 and 11, lab 6 and the glossary, each at 1280 px and at 390 px (a phone). Run it after a
# change to the site's look, look at them, then commit screenshots/.
#   bash tools/screenshots.sh                 # the site in _build/html (bash tools/book.sh), else a fresh build
#   SITE_HTML=DIR bash tools/screenshots.sh   # a site built elsewhere
# A test run never writes there: tests/test_site.py puts its two screenshots in _build/screenshots/.
# This takes the whole set into _build/screenshots-review/ (so the test run itself changes no
# tracked file, which tests/conftest.py checks), then copies it over screenshots/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -z "${SITE_HTML:-}" ] && [ -f _build/html/index.html ]; then
  export SITE_HTML=_build/html
fi
echo "[screenshots] from ${SITE_HTML:-a fresh build} into screenshots/"
rm -rf _build/screenshots-review
SITE_SCREENSHOTS=_build/screenshots-review SITE_SCREENSHOTS_ALL=1 \
  "$PY" -m pytest tests/test_site.py -q -p no:cacheprovider -k test_screenshots "$@"
cp _build/screenshots-review/*.png screenshots/
git status --short screenshots/
