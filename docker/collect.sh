#!/bin/sh
# Gathers what the runtime image needs into OUT, at the paths it will have there:
#   OUT/opt/qvi/bin/    qvi-server and qvi-client, stripped (and libqvi_cuda_graphs.so in the cuda variant);
#   OUT/opt/qvi/site/   the libraries of the torch wheel (and its nvidia wheels) that the variant
#                       loads, in the wheel's own layout, which the programs' RPATH
#                       (/opt/qvi/site/torch/lib) and the libraries' ($ORIGIN/../../nvidia/...) expect.
# Usage: collect.sh cpu|cuda BUILD_DIR SITE_DIR OUT
set -eu
variant=$1 build=$2 site=$3 out=$4
mkdir -p "$out/opt/qvi/bin"
for p in qvi-server qvi-client; do
  strip --strip-unneeded -o "$out/opt/qvi/bin/$p" "$build/$p"
done
# The CUDA graph plugin, built where the wheel has libtorch_cuda (the cuda variant); qvi-server
# loads it from beside itself.
if [ -f "$build/libqvi_cuda_graphs.so" ]; then
  strip --strip-unneeded -o "$out/opt/qvi/bin/libqvi_cuda_graphs.so" "$build/libqvi_cuda_graphs.so"
fi
take() {  # take FILE...: copy each file (relative to SITE_DIR) to the same place under OUT
  for f in "$@"; do
    mkdir -p "$out/opt/qvi/site/$(dirname "$f")"
    cp -a "$site/$f" "$out/opt/qvi/site/$f"
  done
}
cd "$site"
case $variant in
  cpu)
    take torch/lib/libtorch_cpu.so torch/lib/libc10.so torch/lib/libgomp.so.1 \
         nvidia/cu13/lib/libcudart.so.13 nvidia/cu13/lib/libcupti.so.13
    # AOTInductor packages (model.cpu.pt2) link libtorch.so, an empty library that names torch's
    # real ones; the wheel's names libtorch_cuda.so too, which this variant leaves out. So the cpu
    # image gets a libtorch.so of its own that names libtorch_cpu.so alone, as a CPU wheel's does.
    echo 'int qvi_libtorch_stub;' | gcc -x c -shared -fPIC -o "$out/opt/qvi/site/torch/lib/libtorch.so" - \
      -Wl,-soname,libtorch.so -Wl,--no-as-needed -L"$site/torch/lib" -ltorch_cpu -Wl,-rpath,'$ORIGIN' ;;
  cuda)
    # Every shared library of the wheels but the Python bindings; no headers, no static archives.
    take $(find torch/lib nvidia -name '*.so*' -type f ! -name 'libtorch_python.so' ! -path '*/libshm*' | sort) ;;
  *) echo "collect.sh: variant must be cpu or cuda, not '$variant'" >&2; exit 2 ;;
esac
du -sh "$out/opt/qvi/site"
