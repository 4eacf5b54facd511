#!/usr/bin/env bash
# usage: .ci/as_user.sh USER CMD...  (as root) runs CMD as USER in a private mount namespace whose /root shows only
# the Python installation and the checkout when they live there (pyenv keeps Python under /root, mode 700).
set -euo pipefail
user=$1; shift
needed=("$(realpath "$(python -c 'import sys; print(sys.base_prefix)')")" "$PWD")
exec unshare --mount --propagation private bash -c '
set -euo pipefail
user=$1; prefix=$2; checkout=$3; shift 3
mkdir -p /run/trlma-real-root && mount --bind /root /run/trlma-real-root
mount -t tmpfs -o mode=0755,size=1m tmpfs /root
for path in "$prefix" "$checkout"; do
  if [[ $path == /root/* ]]; then
    mkdir -p "$path" && mount --bind "/run/trlma-real-root/${path#/root/}" "$path"
  fi
done
exec runuser -u "$user" -- "$@"' bash "$user" "${needed[@]}" "$@"
