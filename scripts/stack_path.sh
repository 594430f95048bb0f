# Sourced, not run: puts one line of the pinned Prometheus stack first on PATH and exports
# where each line lives, so tests can run both. GPUFED_STACK picks the line (default 3).
#   . scripts/stack_path.sh
_gpufed_tools="${GPUFED_TOOLS:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.tools}"
export GPUFED_STACK="${GPUFED_STACK:-3}"
export GPUFED_STACK2_BIN="$_gpufed_tools/stack/2/bin" GPUFED_STACK3_BIN="$_gpufed_tools/stack/3/bin"
export GPUFED_VM_BIN="$_gpufed_tools/stack/vm/bin"
export PATH="$_gpufed_tools/stack/$GPUFED_STACK/bin:$PATH"
unset _gpufed_tools
