#!/usr/bin/env bash
# The layout rules of docs/architecture.md ("Layout: which folder owns what"), checked on the
# source tree:
#  1. calls point down the table: common/ includes nothing from config/, scheduler/, server/
#     or worker/; config/ nothing from scheduler/, server/ or worker/; server/ and worker/
#     nothing from scheduler/ but the scheduler client, and nothing from each other;
#  2. no hand-written source file outside tests/ longer than the limit (~800 lines: a room a
#     newcomer can hold in mind; docs/architecture.md). SIMD kernel files (names with kernel,
#     avx or simd) and generated code are exempt.
# Usage: check_layout.sh SOURCE_DIR [MAX_LINES]
set -euo pipefail
src=${1:?usage: check_layout.sh SOURCE_DIR [MAX_LINES]}
max=${2:-850}
cd "$src"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  files=$(git ls-files --cached --others --exclude-standard -- '*.cc' '*.h' '*.cu' '*.py')
else
  files=$(find . -path ./build -prune -o -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' \
            -o -name '*.py' \) -print | sed 's#^\./##')
fi
fail=0
# forbidden DIR PATTERN WHY: any #include in DIR/ matching PATTERN breaks the rule.
forbidden() {
  local dir=$1 pattern=$2 why=$3 hits
  hits=$(printf '%s\n' "$files" | grep -E "^$dir/" | grep -vE '\.py$' |
           xargs -r grep -nE "^#include \"($pattern)" 2>/dev/null || true)
  if [ -n "$hits" ]; then
    echo "check_layout: $dir/ $why:"
    printf '%s\n' "$hits" | sed 's/^/  /'
    fail=1
  fi
}
forbidden common 'config/|scheduler/|server/|worker/' \
  'includes config/, scheduler/, server/ or worker/ (common/ is below them all)'
forbidden config 'scheduler/|server/|worker/' \
  'includes scheduler/, server/ or worker/ (the configuration is common ground)'
forbidden server 'scheduler/(scheduler\.h|scheduler_metrics\.h)|worker/' \
  'includes scheduler/ beyond the scheduler client, or worker/'
forbidden worker 'scheduler/(scheduler\.h|scheduler_metrics\.h)|server/' \
  'includes scheduler/ beyond the scheduler client, or server/'
forbidden scheduler 'server/|worker/' 'includes server/ or worker/'

long=$(printf '%s\n' "$files" | grep -vE '^tests/' | grep -viE 'kernel|avx|simd|generated|\.pb\.' |
         xargs -r wc -l 2>/dev/null | awk -v max="$max" '$2 != "total" && $1 > max {print "  " $2 " (" $1 " lines)"}')
if [ -n "$long" ]; then
  echo "check_layout: hand-written files over $max lines (split each by responsibility: the state it owns, the thread that runs it):"
  printf '%s\n' "$long"
  fail=1
fi
if [ "$fail" -ne 0 ]; then exit 1; fi
echo "check_layout: OK (include rules; no hand-written file over $max lines)"
