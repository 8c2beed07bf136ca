# One image for web, worker and agent; the command picks the role.
FROM python:3.11-slim AS base
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PYTHONPATH=/app:/app/platform
WORKDIR /app
COPY pyproject.toml README.md ./
COPY platform platform
COPY workers workers
COPY devices devices
RUN pip install -e '.[openvino]'

FROM node:20-slim AS ui
WORKDIR /ui
COPY frontend/package.json frontend/package-lock.json ./
RUN npm ci
COPY frontend ./
RUN npm run build

FROM base
COPY --from=ui /ui/dist /app/frontend/dist
RUN useradd --create-home kiln && mkdir -p /data && chown kiln /data
USER kiln
ENV KILN_DATA_DIR=/data
EXPOSE 8000
# ASGI under uvicorn workers: an agent's lease long-poll waits on the event loop, holding no thread.
# Kiln's worker class leaves X-Forwarded-For to KILN_TRUSTED_PROXIES (set it to your proxy's address).
CMD ["gunicorn", "kiln.asgi:application", "--worker-class", "kiln.core.web_worker.UvicornWorker", "--chdir", "platform", "--bind", "0.0.0.0:8000", "--workers", "3", "--timeout", "300", "--no-control-socket"]
