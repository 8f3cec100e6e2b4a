#!/bin/bash
# Re-splits the GPU bundle (.gpu/part-00 ... from shared/gpu/build-bundle.sh) into parts small enough
# to travel beside the tracked tree: a device call carries the working tree + its carry, 64 MiB in
# all, and the committed results grow.  Writes .gpu/part-s00, part-s01, ...; send them with
# `bash experiments/gpu/device.sh part s00` (carry .gpu/part-s00), ..., the last one with `&& ... unpack`.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
tree=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 stat -c %s | awk '{s+=$1} END{print s}')
room=$(( 64 * 1048576 - tree - 2 * 1048576 ))   # 2 MiB to spare for files written before the call
[ "$room" -gt 1048576 ] || { echo "the tree alone is $((tree / 1048576)) MiB: no room for a bundle part" >&2; exit 1; }
tmp=$(mktemp -d)
cat .gpu/part-[0-9]*/bundle.part.* > "$tmp/all"
rm -rf .gpu/part-s*
split -b "$room" -d -a 2 "$tmp/all" "$tmp/p."
for f in "$tmp"/p.*; do n=${f##*.}; mkdir -p ".gpu/part-s$n"; mv "$f" ".gpu/part-s$n/bundle.part.s$n"; done
rm -rf "$tmp"
echo "tree $((tree / 1048576)) MiB; $(ls -d .gpu/part-s* | wc -l) parts of at most $((room / 1048576)) MiB"
