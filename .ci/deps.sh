#!/usr/bin/env bash
# Installs the Debian packages eaglegen needs, only those missing.
set -eu
pkgs="build-essential strace libjansson-dev libzstd-dev libarchive-dev libpcre2-dev python3-numpy python3-zstandard zstd gzip xz-utils bzip2"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
    echo "installing:$missing"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi
