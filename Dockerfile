# Stage 1: install dependencies and build the native addon.
FROM node:20-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends cmake g++ make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY package.json package-lock.json ./
COPY native ./native
ENV ONNXRUNTIME_NODE_INSTALL=skip
RUN npm ci --omit=dev --no-audit --no-fund

# Stage 2: the runtime image, without compilers.
FROM node:20-bookworm-slim
WORKDIR /app
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/native/build/Release/conduit_native.node ./native/build/Release/conduit_native.node
COPY package.json ./
COPY bin ./bin
COPY configs ./configs
COPY engine ./engine
COPY gateway ./gateway
COPY native/*.ts ./native/
COPY proto ./proto
COPY router ./router
COPY loadtest ./loadtest
COPY models ./models
# Not root: the image's own `node` user (uid 1000, as deploy/kubernetes runs it) owns nothing it serves.
USER node
EXPOSE 8000 8001 8002
# The gateway's /health: 200 once a worker serves, 503 while starting or draining. A container
# running `conduit worker` has no HTTP port: run it with --no-healthcheck (Kubernetes ignores this).
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:8000/health').then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
ENTRYPOINT ["node", "bin/conduit.js"]
CMD ["serve", "--config", "configs/default.yaml"]
