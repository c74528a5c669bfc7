#!/usr/bin/env bash
# Downloads the Debian packages of libraries the GPU machine may lack and unpacks them into
# .deps/root (git-ignored), to be carried to that machine. scripts/gpu_run.sh prefers the
# machine's own copies and uses these only where one is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .deps && mkdir -p .deps/debs
(cd .deps/debs && apt-get download libjpeg62-turbo libjpeg62-turbo-dev libspdlog-dev libspdlog1.10 \
  libfmt-dev libfmt9 libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev libgtest-dev googletest \
  libcli11-dev zlib1g zlib1g-dev)
for f in .deps/debs/*.deb; do dpkg -x "$f" .deps/root; done
# Absolute links (libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13) would point at the GPU
# machine's own files: made relative to their target inside .deps/root where it is there.
python3 - <<'PY'
import os
root = os.path.abspath('.deps/root')
for d, _, files in os.walk(root):
    for f in files:
        link = os.path.join(d, f)
        if not os.path.islink(link):
            continue
        target = os.readlink(link)
        if os.path.isabs(target) and os.path.exists(root + target):
            os.remove(link)
            os.symlink(os.path.relpath(root + target, d), link)
PY
rm -rf .deps/debs
du -sh .deps/root
