#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks (only the missing packages), then configures and
# builds everything (library, example, benchmark, tests) in ./build. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

# libasan8, libubsan1, libtsan2: the sanitizer runtimes of scripts/sanitize.sh (g++ 12 depends on
# them already; named so the sanitizer passes do not rest on that). chromium: the HTML report's
# browser test (it skips without); libcpp-httplib-dev: the Prometheus endpoint's HTTP server;
# libgloo-dev: the Gloo headers c10d's ProcessGroupGloo needs (the collectives tests).
# zlib1g-dev: gzip-compressed PyTorch profiler traces (torchpilot-analyze). prometheus: promtool
# and the server, for the endpoint's tests against Prometheus itself (they skip without; 22.5 MB
# to download, 332 MB installed with the JavaScript packages it depends on, 218 MB of them
# libjs-moment-timezone; Debian does not start its service in a container without systemd).
packages=(cmake ninja-build g++ ccache libtorch-dev libspdlog-dev libyaml-cpp-dev nlohmann-json3-dev
          libgtest-dev libgmock-dev libjpeg62-turbo-dev libcli11-dev libasan8 libubsan1 libtsan2
          libcpp-httplib-dev chromium libgloo-dev zlib1g-dev python3 prometheus)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
t0=$SECONDS
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
t1=$SECONDS

echo "setup: configuring and building in ./build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >build-configure.log 2>&1 || {
  cat build-configure.log; exit 1; }
rm -f build-configure.log
cmake --build build -j "$(nproc)"
# The README's Testing section quotes these two figures separately.
echo "setup: package installs $((t1 - t0)) s, configure + build $((SECONDS - t1)) s"
