#!/bin/bash
# Re-splits the GPU bundle (.gpu/part-00 ... from shared/gpu/build-bundle.sh) into parts small enough
# to travel beside the tracked tree: a device call carries the working tree + its carry, 64 MiB in
# all, and the committed results grow.  Writes .gpu/part-s00, part-s01, ...; send them with
# `bash experiments/gpu/device.sh part s00` (carry .gpu/part-s00), ..., the last one with `&& ... unpack`.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
# What is on disk travels: a sparse checkout's absent files do not.
tree=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } | { xargs -0 stat -c %s 2>/dev/null || true; } \
  | awk '{s+=$1} END{print s+0}')
room=$(( 64 * 1048576 - tree - 2 * 1048576 ))   # 2 MiB to spare for files written before the call
# The committed results alone can outgrow the limit.  A device call needs only the code: a sparse
# checkout without them sends the rest (git sparse-checkout set --no-cone '/*' '!/experiments/results/'
# '!/plots/' '!/benchmarks/results/'; git sparse-checkout disable brings them back).
[ "$room" -gt 1048576 ] || { echo "the tree alone is $((tree / 1048576)) MiB: no room for a bundle part" \
  "(a sparse checkout without experiments/results/, plots/ and benchmarks/results/ sends the code alone)" >&2; exit 1; }
tmp=$(mktemp -d)
cat .gpu/part-[0-9]*/bundle.part.* > "$tmp/all"
rm -rf .gpu/part-s*
split -b "$room" -d -a 2 "$tmp/all" "$tmp/p."
for f in "$tmp"/p.*; do n=${f##*.}; mkdir -p ".gpu/part-s$n"; mv "$f" ".gpu/part-s$n/bundle.part.s$n"; done
rm -rf "$tmp"
echo "tree $((tree / 1048576)) MiB; $(ls -d .gpu/part-s* | wc -l) parts of at most $((room / 1048576)) MiB"
