# prefixstudy on NVIDIA GPUs: vLLM (from the base image), Ray, and this package.
#   docker build -t prefixstudy .
#   docker run --gpus all -v $PWD/results:/results prefixstudy run h200-tp1 --out /results
# Every version is pinned by docker/constraints.txt; the base tag matches its vllm (tests/test_docker.py checks it).
FROM vllm/vllm-openai:v0.26.0

ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VLLM_USE_FLASHINFER_SAMPLER=0 \
    NCCL_NVLS_ENABLE=0 \
    TORCH_SYMM_MEM_DISABLE_MULTICAST=1

WORKDIR /opt/prefixstudy
COPY pyproject.toml README.md LICENSE ./
COPY docker/constraints.txt docker/
COPY prefixstudy/ prefixstudy/
# vllm==0.26.0 is already there, so pip keeps it; ray[default] (jobs, dashboard) comes with the extra.
# The shipped configs (prefixstudy run h200-tp1) are package data, installed with the package.
# DL3013: "." is this package; what it pulls in is pinned by docker/constraints.txt.
# hadolint ignore=DL3013
RUN python3 -m pip install --no-cache-dir -c docker/constraints.txt ".[gpu]" \
    && python3 -c "import ray, vllm, prefixstudy; assert vllm.__version__ == '0.26.0', vllm.__version__; \
assert ray.__version__ == '2.60.0', ray.__version__"

# Studies run as a plain user (numeric uid, so Kubernetes' runAsNonRoot can check it; 10001 clashes
# with no distribution's first user).  /results is where `docker run -v` puts the host folder.
RUN useradd --create-home --uid 10001 --user-group study \
    && mkdir -p /results \
    && chown study:study /results /opt/prefixstudy
USER 10001:10001
ENV HOME=/home/study

ENTRYPOINT ["prefixstudy"]
CMD ["--help"]
