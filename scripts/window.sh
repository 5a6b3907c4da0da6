# Sourced by scripts/setup, test and demo: which vLLM release of the tested window, and
# its venv. The newest release is the default and lives in .venv; another one
# (VLLM_VERSION=0.33.0) gets a venv of its own, .venv-vllm-0.33.0, and leaves .venv as it
# is. The same window is ttbundles/vllm_window.py's TESTED_VLLM (a test keeps them equal).
TESTED_VLLM_VERSIONS="0.33.0 0.34.0"
DEFAULT_VLLM_VERSION=0.34.0
VLLM_VERSION=${VLLM_VERSION:-$DEFAULT_VLLM_VERSION}
case " $TESTED_VLLM_VERSIONS " in
  *" $VLLM_VERSION "*) ;;
  *)
    echo "VLLM_VERSION=$VLLM_VERSION is outside the tested window ($TESTED_VLLM_VERSIONS)" >&2
    exit 2
    ;;
esac
if [ "$VLLM_VERSION" = "$DEFAULT_VLLM_VERSION" ]; then VENV=.venv; else VENV=.venv-vllm-$VLLM_VERSION; fi
export VLLM_VERSION
