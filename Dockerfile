# kplan-server container. The build stage runs the same scripts as the README
# and CI (scripts/install-deps.sh, scripts/build.sh); the run stage holds the
# binaries and the non-system libraries they load (scripts/bundle.sh), runs as
# a non-root user and carries nothing else.
#
#   docker build -t kplan .                                   # with CUDA kernels
#   docker build -t kplan:cpu --build-arg KPLAN_CUDA=OFF \
#     --build-arg BUILD_IMAGE=ubuntu:24.04 --build-arg RUN_IMAGE=ubuntu:24.04 .
#   docker build -t kplan --build-arg KPLAN_CUDA_ARCHITECTURES="90a;100a" .
#   docker run --gpus all -p 50051:50051 -p 9464:9464 kplan
# The ports come from KPLAN_PORT and KPLAN_METRICS_PORT (the health check
# follows them); arguments after the image name add server flags.
ARG BUILD_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04
ARG RUN_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04

FROM ${BUILD_IMAGE} AS build
ARG KPLAN_CUDA=AUTO
ARG KPLAN_CUDA_ARCHITECTURES=90a
WORKDIR /src
# Packages first, from the one file that names them: a source change reuses
# this layer instead of reinstalling them.
COPY scripts/install-deps.sh scripts/
RUN bash scripts/install-deps.sh
COPY . .
RUN BUILD_DIR=/build bash scripts/build.sh -DKPLAN_CUDA=${KPLAN_CUDA} \
      -DKPLAN_CUDA_ARCHITECTURES=${KPLAN_CUDA_ARCHITECTURES} -DCMAKE_BUILD_TYPE=Release \
      -DKPLAN_BUILD_TESTS=OFF -DKPLAN_BUILD_BENCHMARKS=OFF \
 && bash scripts/bundle.sh /opt/kplan /build/bin/kplan-server /build/bin/kplan

FROM ${RUN_IMAGE}
ARG VERSION=0.1.0
ARG GIT_REVISION=unknown
LABEL org.opencontainers.image.title="kplan" \
      org.opencontainers.image.description="vLLM kernel-plan resolution and fused MoE execution over gRPC" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${GIT_REVISION}"
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin kplan
COPY --from=build /opt/kplan /opt/kplan
ENV PATH=/opt/kplan/bin:${PATH} \
    KPLAN_PORT=50051 \
    KPLAN_METRICS_PORT=9464
USER 10001
# gRPC and Prometheus metrics (the defaults of KPLAN_PORT, KPLAN_METRICS_PORT).
EXPOSE 50051 9464
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s \
  CMD kplan health --server "127.0.0.1:${KPLAN_PORT}" --timeout 2
# The shell expands the ports; flags given to `docker run` follow (the last
# occurrence of a flag wins).
ENTRYPOINT ["/bin/sh", "-c", "exec kplan-server --listen=0.0.0.0:${KPLAN_PORT} --metrics_listen=0.0.0.0:${KPLAN_METRICS_PORT} \"$@\"", "kplan-server"]
CMD ["--exit_timeout=30s"]
