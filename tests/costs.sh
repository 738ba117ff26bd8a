#!/bin/bash
# Regenerates tests/costs.cmake from the build's CTest cost data (the seconds
# each test took in its last runs): every test over 8 s, rounded.
# Usage: tests/costs.sh [BUILD_DIR]   (after a full `ctest --test-dir BUILD_DIR -j2`)
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-build}/Testing/Temporary/CTestCostData.txt
[ -s "$data" ] || { echo "costs.sh: no $data (run the suite first)" >&2; exit 1; }
{
  sed -n '1,5p' tests/costs.cmake
  awk 'NF == 3 && $3 > 8 { printf "set(DL_COST_%s %d)\n", $1, $3 + 0.5 }' "$data" | sort
} > tests/costs.cmake.new
mv tests/costs.cmake.new tests/costs.cmake
echo "tests/costs.cmake: $(grep -c '^set' tests/costs.cmake) tests"
