#!/usr/bin/env bash
# Installs the c10d build in $1 (default: build) into a fresh prefix, builds this standalone
# project against it (find_package(c10d), then pkg-config), and runs its all_reduce on 2
# processes. Used by `make test`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$(cd "${1:-build}" && pwd)"
work="$build/cpp-consumer"
rm -rf "$work"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$here" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
# The same program through pkg-config alone.
flags=$(PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig" pkg-config --cflags --libs c10d)
c++ -O1 -o "$work/allreduce_pc" "$here/allreduce.cc" $flags

for program in "$work/build/allreduce" "$work/allreduce_pc"; do
  store="$work/store.$(basename "$program")"
  pids=()
  for rank in 0 1; do
    timeout 120 "$program" "$store" "$rank" 2 > "$work/rank$rank.log" 2>&1 &
    pids+=($!)
  done
  status=0
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  cat "$work/rank0.log" "$work/rank1.log"
  if [[ $status -ne 0 ]]; then
    echo "cpp consumer: $(basename "$program") failed" >&2
    exit 1
  fi
done
echo "cpp consumer: find_package(c10d) and pkg-config builds both exact on 2 processes"
