# The daemon in a container: `model-runtime serve` on all interfaces of the container, HTTP
# (KServe v2 / Triton REST, /metrics included) on 8000, gRPC (Triton's GRPCInferenceService) on
# 8001 and Triton's metrics port (/metrics) on 8002, serving the model repository mounted at
# /models:
#
#   docker build -t model-runtime .
#   docker run --rm -p 8000:8000 -p 8001:8001 -p 8002:8002 -v "$PWD/models:/models" model-runtime
#
# Options after the image name replace CMD (keep --host 0.0.0.0, or the daemon only listens
# inside the container); e.g. `... model-runtime --host 0.0.0.0 --model-repository /models
# --model-control-mode explicit --load-model NAME`. tests/unit/test_dockerfile.py checks that
# the entry point and every option here are real. The image is not built in CI.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    # Executables compiled from .onnx models on load are cached here (a volume: kept across
    # restarts, so a model compiles once).
    XDG_CACHE_HOME=/cache

WORKDIR /src
COPY pyproject.toml README.md supervisor.py ./
COPY actors ./actors
COPY model_runtime ./model_runtime
RUN pip install . \
    && rm -rf /src \
    && useradd --system --create-home --uid 10001 runtime \
    && mkdir -p /models /cache \
    && chown runtime /models /cache

USER runtime
WORKDIR /home/runtime
VOLUME ["/models", "/cache"]
EXPOSE 8000 8001 8002

HEALTHCHECK --interval=10s --timeout=3s --start-period=60s \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/v2/health/live', timeout=2)"]

ENTRYPOINT ["model-runtime", "serve"]
CMD ["--host", "0.0.0.0", "--port", "8000", "--grpc-port", "8001", "--metrics-port", "8002", \
     "--model-repository", "/models"]
