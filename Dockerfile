# syntax=docker/dockerfile:1
# llm-dedupe-proxy: a static binary on a distroless base (CA certificates, no shell), run as
# a non-root user. Build: docker build --build-arg VERSION=$(git describe --tags --always) -t llm-dedupe-proxy .

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
      -o /out/llm-dedupe-proxy ./cmd/llm-dedupe-proxy

# distroless/static: CA certificates, /etc/passwd with the nonroot user (65532), nothing else.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/llm-dedupe-proxy /llm-dedupe-proxy
USER 65532:65532
ENV LLM_DEDUPE_LISTEN=:8080
EXPOSE 8080
# No shell or curl in the image: the binary asks its own /healthz.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 CMD ["/llm-dedupe-proxy", "healthcheck"]
ENTRYPOINT ["/llm-dedupe-proxy"]
CMD ["serve"]
