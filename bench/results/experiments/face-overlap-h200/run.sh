#!/usr/bin/env bash
# Run on the GPU machine from the tree's root (the device tool's $OUT collects the logs).
set -u
export PATH=/usr/local/cuda/bin:$PATH
S=$SECONDS
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCARACAL_BUILD_TESTS=ON -DCARACAL_BUILD_BENCH=ON > $OUT/configure.log 2>&1 || { tail -30 $OUT/configure.log; exit 1; }
ninja -C build-gpu > $OUT/build.log 2>&1 || { grep -B2 -A10 "error" $OUT/build.log | head -60; exit 1; }
echo "built in $((SECONDS-S)) s"
timeout 300 build-gpu/tests/accel/caracal_gpu_accel_test --gtest_filter='GpuOverlap*:GpuClientQueues*:GpuEcho*:GpuLifecycle*' > $OUT/gpu_accel.log 2>&1; echo "gpu accel rc $?"; grep -E "OK|FAILED|PASSED|Failure" $OUT/gpu_accel.log | tail -30
echo "tests done at $((SECONDS-S)) s"
mkdir -p /tmp/face
HANDLERS=face SERVERS="caracal host_centric" E2E=face_memcached CARACAL_COMMIT=9696d7a timeout 400 bench/compare/run.sh compare build-gpu /tmp/face > $OUT/compare.log 2>&1; echo "compare rc $?"
tail -20 $OUT/compare.log
find /tmp/face -maxdepth 2 -name "compare.*" -exec cp {} $OUT/ \;
find /tmp/face -name "*face_memcached*log" -exec cp {} $OUT/ \; 2>/dev/null
cat $OUT/compare.md 2>/dev/null | head -60
echo "all done at $((SECONDS-S)) s"
