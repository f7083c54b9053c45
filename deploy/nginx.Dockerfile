# nginx from Debian's own package as the gRPC/HTTP load balancer of docker-compose's scale-out profile
# (docs/deploy.md#scale-out). Debian 12's nginx 1.22 is the build tests/triton/test_scale_out.py runs (grpc_pass
# needs nginx >= 1.13.10). The config is deploy/nginx-scale-out.conf, mounted read-only; it writes only below
# /var/lib/lazybatch-nginx.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends nginx \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/lazybatch-nginx/tmp
EXPOSE 8000 8001
CMD ["nginx", "-p", "/var/lib/lazybatch-nginx", "-c", "/etc/lazybatch/nginx.conf", "-e", "/dev/stderr"]
