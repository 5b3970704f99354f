# kplan-server container. The build stage runs the same scripts as the README
# and CI (scripts/install-deps.sh, scripts/build.sh); the run stage holds the
# binaries and the non-system libraries they load (scripts/bundle.sh), runs as
# a non-root user and carries nothing else.
#
#   docker build -t kplan .                                   # with CUDA kernels
#   docker build -t kplan:cpu --build-arg KPLAN_CUDA=OFF \
#     --build-arg BUILD_IMAGE=ubuntu:24.04 --build-arg RUN_IMAGE=ubuntu:24.04 .
#   docker run --gpus all -p 50051:50051 -p 9464:9464 kplan
ARG BUILD_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04
ARG RUN_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04

FROM ${BUILD_IMAGE} AS build
ARG KPLAN_CUDA=AUTO
WORKDIR /src
COPY . .
RUN bash scripts/install-deps.sh \
 && BUILD_DIR=/build bash scripts/build.sh -DKPLAN_CUDA=${KPLAN_CUDA} -DCMAKE_BUILD_TYPE=Release \
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
ENV PATH=/opt/kplan/bin:${PATH}
USER 10001
# gRPC and Prometheus metrics.
EXPOSE 50051 9464
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s \
  CMD ["kplan", "health", "--server", "127.0.0.1:50051", "--timeout", "2"]
ENTRYPOINT ["kplan-server"]
CMD ["--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9464", "--exit_timeout=30s"]
