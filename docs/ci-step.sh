#!/usr/bin/env bash
# kvarena's conformance check as one CI step of a serving engine (docs/ci.md). Run it from the engine's
# checkout, in the Python environment where the engine (and its kvarena adapter) imports:
#
#   KVARENA_SRC='git+https://github.com/<org>/kvarena@<tag>' bash docs/ci-step.sh
#
# Exit status is kvarena conform's: 0 pass, 1 violation, 2 broken input (adapter, vector file, arguments),
# 3 vacuous or thin (the run exercised nothing, or passed on fewer vectors than --min-completed). The JUnit
# report is written in every case (exit 2: one <error> naming the module and the error).
set -euo pipefail

# Where kvarena comes from: a git URL pinned to a tag or commit, or a wheel as a file:// URL
# (file:///abs/path/kvarena-0.1.0-py3-none-any.whl). kvarena is not on the package index.
: "${KVARENA_SRC:?set KVARENA_SRC to git+https://github.com/<org>/kvarena@<tag> or file:///path/to/kvarena.whl}"
# A local clone: pip < 24.1 refuses git+file:///abs/path ("Invalid requirement": its URL parser wants a host);
# git+file://localhost/abs/path is the same URL and every pip takes it (tested: pip 23.2.1 and 26.3)
KVARENA_SRC="${KVARENA_SRC/#git+file:\/\/\//git+file://localhost/}"
KVARENA_IMPL="${KVARENA_IMPL:-myengine.kvarena_adapter:make}"  # module:factory, imported from this directory
KVARENA_LEVEL="${KVARENA_LEVEL:-safety}"                        # what a third-party allocator can promise
KVARENA_JUNIT="${KVARENA_JUNIT:-kvarena.xml}"

python -m pip install --disable-pip-version-check "kvarena[conform] @ ${KVARENA_SRC}"
kvarena conform --impl "$KVARENA_IMPL" --level "$KVARENA_LEVEL" --junit-xml "$KVARENA_JUNIT"
