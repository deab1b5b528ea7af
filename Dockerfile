# The one image of cozygpu: `cozygpu controller` (Deployment) and `cozygpu agent` (DaemonSet).
# Not built in this repository's CI (no container runtime there); the chart's
# image.repository/tag point at where the platform publishes it.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY cozygpu ./cozygpu
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir /wheels/*.whl
# The controller runs as this user (runAsNonRoot); the agent's pod runs as root
# only to reach kubelet's root-owned pod-resources socket.
USER 65532:65532
ENTRYPOINT ["cozygpu"]
