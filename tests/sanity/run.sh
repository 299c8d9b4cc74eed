#!/usr/bin/env bash
# ansible-test sanity on the collection: its files (what `ansible-galaxy collection build` packs) are
# copied under ansible_collections/gpufleet/proxmox in a temporary directory, where ansible-test wants them.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/gpufleet-sanity.XXXXXX)
trap 'rm -rf "$work"' EXIT
dest=$work/ansible_collections/gpufleet/proxmox
mkdir -p "$dest"
cd "$here"
git ls-files -co --exclude-standard \
  | grep -Ev '^(\.collections|\.ci|src|inventories/lab(-cluster)?/cluster\.py|bench|docs|tests/(unit|integration|plugins|conftest\.py)|pyproject\.toml|Makefile)(/|$)' \
  | tar -T - -cf - | tar -xf - -C "$dest"
# ansible-test bootstraps pip in its venv with a script it downloads; where that site cannot be reached,
# ensurepip does the same job.
cache=$HOME/.ansible/test/cache
mkdir -p "$cache"
for v in 24_2 25_0 25_1; do [ -f "$cache/get_pip_$v.py" ] || cp tests/sanity/get_pip_stub.py "$cache/get_pip_$v.py"; done
cd "$dest"
ansible-test sanity --venv --python 3.11 "$@"
