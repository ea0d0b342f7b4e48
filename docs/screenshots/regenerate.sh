#!/usr/bin/env bash
# Regenerate the README's screenshots (docs/screenshots/*.png) from the browser tests, never by hand:
# tests/test_ui_browser.py drives Debian's Chromium through the pages and saves what it sees with
# shot()/shot_narrow() into DPGATE_SCREENSHOT_DIR. Needs Playwright (pip install -e '.[browser]') and
# /usr/bin/chromium (apt-get install chromium; .ci/run installs both). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/../.."
export DPGATE_SCREENSHOT_DIR=docs/screenshots
python -m pytest tests/test_ui_browser.py -p no:cacheprovider -q "$@"
ls -l docs/screenshots/*.png
