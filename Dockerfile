# kvmesh daemon image: `docker build -t kvmesh:0.1.0 .` (deploy/k8s uses image "kvmesh").
# Two stages: the build needs the dev dependencies (TypeScript); the image ships dist/ and the
# production node_modules only (zeromq's prebuilt libzmq for linux-x64 glibc comes with it).
FROM node:20-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci
COPY tsconfig.json tsconfig.build.json ./
COPY src src
COPY mesh mesh
COPY cli cli
RUN npm run build && npm prune --omit=dev

FROM node:20-bookworm-slim
ENV NODE_ENV=production
WORKDIR /app
COPY --from=build /app/package.json ./
COPY --from=build /app/node_modules node_modules
COPY --from=build /app/dist dist
# The image's node user (uid 1000); the StatefulSet in deploy/k8s runs as it too.
USER 1000
# HTTP API, mesh PUB (--replica-sync-port), mesh control (the next port).
EXPOSE 8092 7100 7101
# For docker run / compose (Kubernetes uses its own probes): GET /health on the HTTP port
# (KVMESH_PORT when set; with --port on the command line, set KVMESH_PORT instead).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
  CMD ["node", "-e", "fetch(`http://127.0.0.1:${process.env.KVMESH_PORT ?? 8092}/health`).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
ENTRYPOINT ["node", "dist/cli/main.js"]
CMD ["serve", "--host=0.0.0.0"]
