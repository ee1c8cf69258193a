#!/usr/bin/env bash
# `make test-localstack`: the integration tests (pytest -m integration) against a second,
# independent S3 and DynamoDB — LocalStack's S3 in host mode (no Docker) and dynalite —
# instead of the embedded moto server.
#
# Needs Python >= 3.12 (LocalStack's own venv; set LOCALSTACK_PYTHON to choose one) and npm.
# Exits 3 with a one-line reason when either is missing (.ci/run turns that into a skip).
# Everything it installs lands under build/; both servers are stopped by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

ROOT=$PWD
BUILD=$ROOT/build/localstack
LS_VENV=$ROOT/build/localstack-venv
DYNALITE_DIR=$ROOT/build/dynalite
PYTEST=${PYTEST:-$ROOT/.venv/bin/pytest}
mkdir -p "$BUILD"

find_python() {
    if [ -n "${LOCALSTACK_PYTHON:-}" ]; then echo "$LOCALSTACK_PYTHON"; return; fi
    local candidate
    for candidate in python3.13 python3.12 \
        "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13*/bin/python3 \
        "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3; do
        if command -v "$candidate" >/dev/null 2>&1 \
            && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
            command -v "$candidate"; return
        fi
    done
}

PY312=$(find_python || true)
if [ -z "$PY312" ]; then
    echo "test-localstack: no Python >= 3.12 found (LocalStack needs it; set LOCALSTACK_PYTHON)"
    exit 3
fi
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
    echo "test-localstack: npm/node not found (dynalite, the DynamoDB server, is an npm package)"
    exit 3
fi

# --- install (pinned; skipped when the pins did not change)
if [ ! -f "$LS_VENV/.installed" ] || [ localstack/requirements.txt -nt "$LS_VENV/.installed" ]; then
    echo "test-localstack: installing LocalStack into $LS_VENV with $PY312"
    rm -rf "$LS_VENV"
    "$PY312" -m venv "$LS_VENV"
    "$LS_VENV/bin/python" -m pip install --quiet --no-compile -r localstack/requirements.txt
    touch "$LS_VENV/.installed"
fi
if [ ! -f "$DYNALITE_DIR/.installed" ] || [ localstack/package-lock.json -nt "$DYNALITE_DIR/.installed" ]; then
    echo "test-localstack: installing dynalite into $DYNALITE_DIR"
    rm -rf "$DYNALITE_DIR" && mkdir -p "$DYNALITE_DIR"
    cp localstack/package.json localstack/package-lock.json "$DYNALITE_DIR/"
    (cd "$DYNALITE_DIR" && npm ci --no-audit --no-fund --loglevel=error)
    touch "$DYNALITE_DIR/.installed"
fi

free_port() {
    "$PY312" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

PIDS=()
stop_servers() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    echo "test-localstack: stopped PIDs ${PIDS[*]}"
}
trap stop_servers EXIT

# --- start LocalStack S3 (host mode: OVERRIDE_IN_DOCKER=0 keeps its files under build/)
S3_PORT=$(free_port)
rm -rf "$BUILD/localstack-root" && mkdir -p "$BUILD/localstack-root"
OVERRIDE_IN_DOCKER=0 GATEWAY_LISTEN=127.0.0.1:$S3_PORT SERVICES=s3 \
    FILESYSTEM_ROOT=$BUILD/localstack-root SKIP_SSL_CERT_DOWNLOAD=1 DISABLE_EVENTS=1 \
    "$LS_VENV/bin/python" -m localstack.runtime.main >"$BUILD/localstack.log" 2>&1 &
PIDS+=($!)

# --- start dynalite (in memory)
DDB_PORT=$(free_port)
node "$DYNALITE_DIR/node_modules/dynalite/cli.js" --host 127.0.0.1 --port "$DDB_PORT" \
    >"$BUILD/dynalite.log" 2>&1 &
PIDS+=($!)

S3_ENDPOINT=http://127.0.0.1:$S3_PORT
DDB_ENDPOINT=http://127.0.0.1:$DDB_PORT
for _ in $(seq 1 120); do
    if curl -sf "$S3_ENDPOINT/_localstack/health" 2>/dev/null | grep -q '"s3": "\(available\|running\)"' \
        && curl -s -o /dev/null "$DDB_ENDPOINT"; then
        break
    fi
    if ! kill -0 "${PIDS[0]}" 2>/dev/null || ! kill -0 "${PIDS[1]}" 2>/dev/null; then
        echo "test-localstack: a server exited during startup; logs:"
        tail -20 "$BUILD/localstack.log" "$BUILD/dynalite.log"
        exit 1
    fi
    sleep 0.5
done

LS_VERSION=$(curl -sf "$S3_ENDPOINT/_localstack/health" | "$PY312" -c 'import json, sys; print(json.load(sys.stdin)["version"])')
DYNALITE_VERSION=$(node -p "require('$DYNALITE_DIR/node_modules/dynalite/package.json').version")
echo "test-localstack: S3 = LocalStack $LS_VERSION (host mode, PID ${PIDS[0]}) at $S3_ENDPOINT"
echo "test-localstack: DynamoDB = dynalite $DYNALITE_VERSION (PID ${PIDS[1]}) at $DDB_ENDPOINT"
echo "test-localstack: moto is not started; the tests refuse to import it"

# --- the integration tests, pointed at both servers
status=0
LANCETX_TEST_BACKEND=external \
LANCETX_TEST_S3_ENDPOINT=$S3_ENDPOINT \
LANCETX_TEST_DYNAMODB_ENDPOINT=$DDB_ENDPOINT \
LANCETX_TEST_BACKEND_NAME="LocalStack $LS_VERSION S3 + dynalite $DYNALITE_VERSION" \
    "$PYTEST" -m integration -p no:cacheprovider "$@" || status=$?
exit $status
