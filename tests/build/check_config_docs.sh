#!/bin/sh
# docs/config.md against the knob table (scheduler/cluster_knobs.cc): the generated blocks of
# the file must be what bitpush-config-docs generates from the table now.
# usage: check_config_docs.sh BITPUSH_CONFIG_DOCS DOC
set -u
[ $# = 2 ] || { echo "usage: $0 BITPUSH_CONFIG_DOCS DOC"; exit 2; }
tool=$1
doc=$2
generated=$(mktemp)
trap 'rm -f "$generated"' EXIT
"$tool" update "$doc" --output "$generated" || exit 1
if ! diff -u --label "$doc (as written)" --label "$doc (from the knob table)" "$doc" "$generated"; then
  echo
  echo "$doc and the knob table (scheduler/cluster_knobs.cc) disagree."
  echo "Regenerate the tables: make config-docs   (or: $tool update $doc)"
  exit 1
fi
echo "$doc agrees with the knob table"
