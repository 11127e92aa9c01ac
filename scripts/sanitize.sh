#!/usr/bin/env bash
# Build mqstore.commitlog._native with AddressSanitizer and UndefinedBehaviorSanitizer into a
# scratch copy of the tree, run the C-facing tests and the fuzz of every native
# function under it, and exit non-zero on any finding (or any failing test).
#
# Usage: scripts/sanitize.sh [quick|full]   (default quick)
#   quick: MQSTORE_FUZZ_EXAMPLES=300 and the C-facing tests (a CI-sized run)
#   full:  MQSTORE_FUZZ_EXAMPLES=5000 (override either with the variable itself)
# Environment: PY (default .venv/bin/python), SANITIZE_DIR (default a new mktemp -d),
#   CC (default gcc: the runtime preloaded below is gcc's libasan).
#
# Why a scratch copy: the instrumented .so must never replace commitlog/_native*.so in
# the tree (other sessions and `make test` load that one). In the copy, `commitlog`
# resolves to the copy's own package (PYTHONPATH first), so the instrumented build is
# the one imported; the script checks that, and MQSTORE_REQUIRE_NATIVE=1 makes a build
# that silently fell back to pure Python (the extension is optional) fail instead.
#
# Runtime settings, and why:
# - LD_PRELOAD=libasan.so: python itself is not instrumented, so the ASan runtime must
#   be loaded before anything else for its malloc interposition to cover the process.
# - ASAN_OPTIONS=detect_leaks=0: CPython keeps interned strings, static types and
#   arenas alive until exit by design; LeakSanitizer would report thousands of those
#   and hide real findings. Leaks are not what this run looks for (out-of-bounds
#   reads and writes, use after free, overflow, misaligned loads, division by zero).
# - PYTHONMALLOC=malloc: without it, small Python objects (bytes, bytearray, tuples)
#   come from pymalloc arenas that ASan sees as one big block, so an overflow from one
#   object into its neighbour would go unseen. With it, each has its own redzones.
# - -fno-wrapv: CPython compiles extensions with -fwrapv (sysconfig CFLAGS), which
#   defines signed overflow as wrapping, so UBSan would not check it at all; the later
#   -fno-wrapv wins and makes every signed overflow (offset + size) a finding.
# - -fno-sanitize-recover=all and halt_on_error=1: the first finding aborts the process
#   (the test run fails) instead of printing and going on.
# - log_path: every report is also written to $SANITIZE_DIR/reports/, and the script
#   fails when that directory is not empty (a finding in a subprocess a test starts
#   would otherwise surface only as that test's failure message).
set -euo pipefail

MODE=${1:-quick}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
CC=${CC:-gcc}
SCRATCH=${SANITIZE_DIR:-$(mktemp -d /tmp/mqstore-sanitize.XXXXXX)}
case "$MODE" in
    quick) EXAMPLES=${MQSTORE_FUZZ_EXAMPLES:-300} ;;
    full) EXAMPLES=${MQSTORE_FUZZ_EXAMPLES:-5000} ;;
    *) echo "usage: $0 [quick|full]" >&2; exit 2 ;;
esac
# The tests that call C: the native functions themselves, the Appender against its twin,
# the columnar read (read_columns, slices, rows, tuples) alone and through
# MessageStore.get_batch, the CommitLog (encoders, recovery's scan_records,
# Appender.append), the tail writer and the dispatcher (write_units, feed_columns), the
# crafted-ConsumeQueue-unit test through MessageStore.get, the time look-up
# (time_search, first_reaching) alone and through ConsumeQueue.offset_for_time, and the
# dispatcher's header scan (dispatch_columns) alone and through the re-dispatch at open,
# the re-dispatch's check of kept units (units_in_place) alone and through a queue,
# the Kafka record walk (record_spans) alone and through the segmented cleaner, the
# broker's Kafka codec (kafka_batch, kafka_values) alone and through its storage adapter,
# MessageStore.put's C path (Putter) against the method, and the shared unit log's pass
# over its units (runs_append) alone and through the log.
TESTS=(
    tests/commitlog/test_native.py
    tests/commitlog/test_native_fuzz.py
    tests/commitlog/test_appender.py
    tests/commitlog/test_columns.py
    tests/mqstore/test_reader.py
    tests/commitlog/test_commitlog.py
    tests/commitlog/test_recovery.py
    tests/consumequeue/test_tail_writer.py
    tests/dispatch/test_dispatcher.py
    tests/consumequeue/test_time_index.py
    tests/consumequeue/test_queue_time.py
    tests/commitlog/test_header_scan.py
    tests/dispatch/test_log_scan.py
    tests/consumequeue/test_reput_check.py
    tests/segmented/test_record_batch.py
    tests/segmented/test_cleaner.py
    tests/mqstore/broker/test_fetch_batch.py
    tests/mqstore/broker/test_produce_columns.py
    tests/mqstore/broker/test_column_log.py
    tests/mqstore/test_put.py
    tests/consumequeue/test_shared_runs.py
    tests/consumequeue/test_shared_log.py
)

echo "sanitize: scratch copy in $SCRATCH (mode $MODE, $EXAMPLES fuzz examples per function)"
rm -rf "$SCRATCH/src" "$SCRATCH/tmp" "$SCRATCH/reports"
mkdir -p "$SCRATCH/src" "$SCRATCH/reports"
(cd "$ROOT" && git ls-files -co --exclude-standard -z | grep -zv '\.so$' |
    xargs -0 cp -P --parents -t "$SCRATCH/src")

SAN_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all -fno-wrapv"
(cd "$SCRATCH/src" && CC=$CC CFLAGS="$SAN_FLAGS -g" LDFLAGS="-fsanitize=address,undefined" \
    "$PY" setup.py -q build_ext --inplace --build-temp "$SCRATCH/tmp" 2>&1 |
    grep -v -e '_BetaConfiguration' -e 'warnings.warn' || true)
SO=$(ls "$SCRATCH"/src/commitlog/_native*.so 2>/dev/null || true)
# Instrumented for both, signed overflow included (captured first: `| grep -q` would
# end the pipe early and fail it under pipefail).
LINKED=$([ -n "$SO" ] && ldd "$SO" || true)
SYMBOLS=$([ -n "$SO" ] && nm -D "$SO" || true)
if [[ $LINKED != *libasan* || $SYMBOLS != *__ubsan_handle_add_overflow* ]]; then
    echo "sanitize: the instrumented build failed (no ASan/UBSan _native*.so in $SCRATCH/src)" >&2
    exit 1
fi

LIBASAN=$("$CC" -print-file-name=libasan.so)
export LD_PRELOAD=$LIBASAN
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=1:log_path=$SCRATCH/reports/asan"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$SCRATCH/reports/ubsan"
export PYTHONMALLOC=malloc
export MQSTORE_REQUIRE_NATIVE=1
export MQSTORE_FUZZ_EXAMPLES=$EXAMPLES
export MQSTORE_FUZZ_REPORT=$SCRATCH/fuzz-report.json
export PYTHONPATH=$SCRATCH/src
unset MQSTORE_PURE_PYTHON

cd "$SCRATCH/src"
# (mqstore/commitlog is a symlink to commitlog/: compare the files, not the paths)
LOADED=$("$PY" -c 'import mqstore.commitlog._native as n; print(n.__file__)')
if [ "$(readlink -f "$LOADED")" != "$(readlink -f "$SO")" ]; then
    echo "sanitize: imported $LOADED, not the instrumented $SO" >&2
    exit 1
fi

START=$(date +%s)
STATUS=0
"$PY" -m pytest -q -p no:cacheprovider -s "${TESTS[@]}" 2>&1 | tee "$SCRATCH/pytest.log" ||
    STATUS=$?
ELAPSED=$(($(date +%s) - START))

FINDINGS=$(find "$SCRATCH/reports" -type f | wc -l)
if grep -q -e 'runtime error:' -e 'ERROR: AddressSanitizer' "$SCRATCH/pytest.log"; then
    FINDINGS=$((FINDINGS + 1))
fi
echo "sanitize: pytest exit $STATUS, sanitizer findings $FINDINGS, ${ELAPSED}s"
[ -f "$MQSTORE_FUZZ_REPORT" ] && echo "sanitize: fuzz inputs: $(cat "$MQSTORE_FUZZ_REPORT" | tr -d '\n ')"
if [ "$FINDINGS" -ne 0 ]; then
    find "$SCRATCH/reports" -type f -exec sh -c 'echo "=== $1"; head -60 "$1"' _ {} \;
    exit 1
fi
exit "$STATUS"
