#!/bin/bash
# make test's first prerequisite: a Chromium that renders the HTML report (tests/unit/report/test_report.py
# takes a screenshot with --screenshot and reads the page with --dump-dom).
#
# Why Debian's chromium and not a browser from pip: pip packages that bring a browser either fetch it
# at run time (playwright, pyppeteer), which a machine without that download cannot do, or ship a
# stripped build with its own command line (kaleido's), which has neither --screenshot nor --dump-dom.
#
# Found on PATH: nothing to do.  Missing, as root with apt-get: installed quietly (once: the next call
# finds it).  Missing otherwise: one line with the command to run, exit 1.
set -u
for exe in chromium chromium-browser google-chrome; do
  command -v "$exe" >/dev/null 2>&1 && exit 0
done
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "make test: installing chromium (apt-get, once; the HTML report test renders in it)" >&2
  log=$(mktemp)
  if apt-get update -qq >"$log" 2>&1 \
     && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >>"$log" 2>&1 \
     && command -v chromium >/dev/null 2>&1; then
    rm -f "$log"
    exit 0
  fi
  echo "make test: apt-get could not install chromium (its log: $log); install a chromium binary and run make test again" >&2
  exit 1
fi
echo "make test needs chromium (the HTML report test renders in it): sudo apt-get install chromium" >&2
exit 1
