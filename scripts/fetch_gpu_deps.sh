#!/usr/bin/env bash
# Downloads the Debian packages of libraries the GPU machine may lack and unpacks them into
# .deps/root (git-ignored), to be carried to that machine. scripts/gpu_run.sh prefers the
# machine's own copies and uses these only where one is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .deps && mkdir -p .deps/debs
(cd .deps/debs && apt-get download libjpeg62-turbo libjpeg62-turbo-dev libspdlog-dev libspdlog1.10 \
  libfmt-dev libfmt9 libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev libgtest-dev googletest \
  libcli11-dev)
for f in .deps/debs/*.deb; do dpkg -x "$f" .deps/root; done
rm -rf .deps/debs
du -sh .deps/root
