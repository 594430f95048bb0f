# The gpufed image: controller (`gpufed serve`), exporter (`gpufed-exporter`) and the
# DingTalk relay (`gpufed-dingtalk`). NVML comes from the host driver through the NVIDIA
# Container Toolkit at run time, so the image carries no CUDA.
# promtool and amtool: the controller checks every config it serves with the tools of the
# releases the deployment's images pin (federation/master/images.py; tests/deploy/test_images.py
# keeps these two lines equal to that table). Debian's packages would be another line.
FROM quay.io/prometheus/prometheus:v3.13.3 AS prometheus
FROM quay.io/prometheus/alertmanager:v0.35.1 AS alertmanager
FROM python:3.11-slim
COPY --from=prometheus /bin/promtool /usr/local/bin/promtool
COPY --from=alertmanager /bin/amtool /usr/local/bin/amtool
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements requirements
COPY exporter exporter
COPY sharder sharder
COPY federation federation
COPY thanos thanos
COPY alertmanager alertmanager
COPY logs logs
COPY webconfig webconfig
RUN pip install --no-cache-dir --require-hashes --no-deps -r requirements/runtime.txt \
    && pip install --no-cache-dir --no-deps --no-build-isolation . && rm -rf /src \
    && mkdir -p /var/lib/gpufed && chown 65534:65534 /var/lib/gpufed
WORKDIR /
USER 65534:65534
EXPOSE 8080 9400 8060
