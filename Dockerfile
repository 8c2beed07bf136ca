# One image for web, worker and agent; the command picks the role.
FROM python:3.11-slim AS base
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PYTHONPATH=/app:/app/platform KILN_DOWNLOADS_DIR=/app/dist
WORKDIR /app
COPY pyproject.toml README.md ./
COPY distributions distributions
COPY platform platform
COPY workers workers
COPY devices devices
COPY kiln_contract kiln_contract
COPY kiln_client kiln_client
# The four installables of this tree as wheels: the image runs them all, and its web server serves the contract's, the
# agent's and the client's at /downloads/, so that a device installs the agent from the Kiln it talks to.
RUN python distributions/build.py /app/dist --server --isolated \
 && pip install "$(ls /app/dist/kiln_server-*.whl)[openvino]" "$(ls /app/dist/kiln_agent-*.whl)[openvino]" /app/dist/kiln_client-*.whl \
      /app/dist/kiln_contract-*.whl \
 && rm /app/dist/kiln_server-*.whl

FROM node:20-slim AS ui
WORKDIR /ui
COPY frontend/package.json frontend/package-lock.json ./
RUN npm ci
COPY frontend ./
RUN npm run build

# A device agent alone: the kiln-agent wheel (with kiln-contract) and its runtimes, nothing of the server (no Django, Celery, psycopg).
FROM python:3.11-slim AS agent
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
COPY --from=base /app/dist/kiln_agent-*.whl /app/dist/kiln_contract-*.whl /tmp/
RUN pip install "$(ls /tmp/kiln_agent-*.whl)[openvino]" /tmp/kiln_contract-*.whl && rm /tmp/kiln_agent-*.whl /tmp/kiln_contract-*.whl \
 && useradd --create-home kiln && mkdir -p /agent && chown kiln /agent
USER kiln
CMD ["kiln-agent", "run", "--work-dir", "/agent/work"]

FROM base
COPY --from=ui /ui/dist /app/frontend/dist
RUN useradd --create-home kiln && mkdir -p /data && chown kiln /data
USER kiln
ENV KILN_DATA_DIR=/data
EXPOSE 8000
# ASGI under uvicorn workers: an agent's lease long-poll waits on the event loop, holding no thread.
# Kiln's worker class leaves X-Forwarded-For to KILN_TRUSTED_PROXIES (set it to your proxy's address).
CMD ["gunicorn", "kiln.asgi:application", "--worker-class", "kiln.core.web_worker.UvicornWorker", "--chdir", "platform", "--bind", "0.0.0.0:8000", "--workers", "3", "--timeout", "300", "--no-control-socket"]
