# The egress-gateway image: built with the Rust toolchain, run on distroless "cc"
# (glibc, libgcc, CA certificates; no shell, no package manager) as a non-root user.
#
#   docker build -t registry.example.com/egress-gateway:0.1.0 .
#
# Ports: 4002 proxy, 9090 admin (metrics, /healthz, /readyz), 53/udp+tcp DNS firewall
# when [dns] is configured. Volumes: /etc/egress-gateway (gateway.toml, policy/,
# keys and secret files, mounted read-only). Environment: EGRESS_GATEWAY_CONFIG (the
# config file; default below). Secrets come as files (token_file, secret_file,
# private_key_file) or, where a key supports it, an environment variable
# (secret_env). Binding port 53 needs only CAP_NET_BIND_SERVICE (add it, drop all).
# tests/container.rs builds Dockerfile.scratch, the same runtime layout from the
# locally built binary, because CI machines reach no container registry.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --bin egress-gateway \
    && install -D -m 0755 target/release/egress-gateway /out/egress-gateway

FROM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="egress-gateway" \
      org.opencontainers.image.description="Egress gateway and DNS firewall for AI-agent code sandboxes" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/egress-gateway/egress-gateway" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/egress-gateway /usr/local/bin/egress-gateway
COPY config/gateway.toml /etc/egress-gateway/gateway.toml
COPY policy /etc/egress-gateway/policy
ENV EGRESS_GATEWAY_CONFIG=/etc/egress-gateway/gateway.toml
# distroless "nonroot": uid and gid 65532.
USER 65532:65532
EXPOSE 4002 9090 53/udp 53/tcp
VOLUME ["/etc/egress-gateway"]
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/egress-gateway", "health"]
ENTRYPOINT ["/usr/local/bin/egress-gateway"]
CMD ["serve"]
