# The gpufed image: controller (`gpufed serve`), exporter (`gpufed-exporter`) and the
# DingTalk relay (`gpufed-dingtalk`). NVML comes from the host driver through the NVIDIA
# Container Toolkit at run time, so the image carries no CUDA.
FROM python:3.11-slim
# promtool and amtool: the controller checks every config it serves (Debian's 2.42 / 0.25)
RUN apt-get update && apt-get install -y --no-install-recommends prometheus prometheus-alertmanager \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements requirements
COPY exporter exporter
COPY sharder sharder
COPY federation federation
COPY thanos thanos
COPY alertmanager alertmanager
COPY logs logs
RUN pip install --no-cache-dir --require-hashes --no-deps -r requirements/runtime.txt \
    && pip install --no-cache-dir --no-deps --no-build-isolation . && rm -rf /src \
    && mkdir -p /var/lib/gpufed && chown 65534:65534 /var/lib/gpufed
WORKDIR /
USER 65534:65534
EXPOSE 8080 9400 8060
