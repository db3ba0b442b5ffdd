# Stage 1: every dependency, the native addon and the compiled JavaScript (dist/), then the
# development dependencies (TypeScript, test clients) pruned away.
FROM node:20-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends cmake g++ make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
# package.json's allowScripts keeps onnxruntime-node's install script (a download of CUDA
# libraries the CPU build never loads) from running, but only npm 11 reads that field; this
# image's npm is the 10.x that Node 20 bundles, so the script's own switch says the same here.
ENV ONNXRUNTIME_NODE_INSTALL=skip
COPY package.json package-lock.json tsconfig.json tsconfig.build.json package-root.ts gguf.ts ./
COPY native ./native
COPY bin ./bin
COPY configs ./configs
COPY engine ./engine
COPY triton ./triton
COPY gateway ./gateway
COPY loadtest ./loadtest
COPY proto ./proto
COPY router ./router
# The install script builds the native addon and dist/ (npm run build).
RUN npm ci --no-audit --no-fund && npm prune --omit=dev --no-audit --no-fund

# Stage 2: the runtime image: compiled JavaScript and what it reads, no compilers, no sources.
FROM node:20-bookworm-slim
WORKDIR /app
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
COPY --from=build /app/native/build/Release/conduit_native.node ./native/build/Release/conduit_native.node
COPY package.json ./
COPY bin/conduit.js ./bin/conduit.js
COPY gateway/chat-page/index.html ./gateway/chat-page/index.html
COPY proto/*.proto ./proto/
COPY configs/default.yaml ./configs/default.yaml
COPY models ./models
# Not root: the image's own `node` user (uid 1000, as deploy/kubernetes runs it) owns nothing it serves.
USER node
EXPOSE 8000 8001 8002
# The gateway's /health: 200 once a worker serves, 503 while starting or draining. A container
# running `conduit worker` has no HTTP port: run it with --no-healthcheck (Kubernetes ignores this).
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:8000/health').then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
# bin/conduit.js runs dist/bin/cli.js with plain node (no TypeScript loader).
ENTRYPOINT ["node", "bin/conduit.js"]
CMD ["serve", "--config", "configs/default.yaml"]
