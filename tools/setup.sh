#!/usr/bin/env bash
# Installs the Debian packages parity needs, if any are missing (libxml2-utils:
# xmllint, which checks the matrix's JUnit report against tests/cli/junit.xsd).  Idempotent;
# prints nothing when everything is already there.  Run as root (or with sudo
# available).
#   --with-torch   also python3-torch (Debian's PyTorch 1.13, CPU; about 200
#                  packages with its dependencies), for the python_torch tests
#                  and parity_torch (docs/gpu-rollout.md)
#   --with-fuzz    also clang, its libFuzzer runtime and OpenMP (tools/fuzz.sh)
#   --with-offload gcc-12-offload-nvptx (GCC's OpenMP offload compiler for
#                  NVIDIA GPUs, with nvptx-tools and libgomp's nvptx plugin),
#                  for the -Doffload=nvptx build (docs/gpu.md)
#   --with-cluster iproute2 (ip netns), util-linux (unshare), bc, iptables, iputils-ping and
#                  libnetfilter-queue-dev (the netem scenario's delayer) for the opt-in
#                  cluster tier (tools/cluster-tier.sh, docs/testing.md)
set -euo pipefail
pkgs=(gcc meson ninja-build pkg-config libmpich-dev mpich libhwloc-dev libopenblas-dev
      libcriterion-dev libcjson-dev nettle-dev python3-numpy python3-venv libxml2-utils)
for a in "$@"; do
  case "$a" in
    --with-torch) pkgs+=(python3-torch) ;;
    --with-fuzz) pkgs+=(clang libclang-rt-14-dev libomp-dev) ;;
    --with-offload) pkgs+=(gcc-12-offload-nvptx libgomp-plugin-nvptx1) ;;
    --with-cluster) pkgs+=(iproute2 util-linux bc iptables iputils-ping libnetfilter-queue-dev) ;;
    *) echo "parity setup: unknown option '$a' (known: --with-torch, --with-fuzz, --with-offload, --with-cluster)" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "parity setup: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
