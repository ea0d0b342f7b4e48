# dpgate gateway image (see docker-compose.yml for the gateway + PostgreSQL setup).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# install the package first (cached layer while only policies change)
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install .

# policies live in /app/policies; their relative sources resolve against /app, where
# `dpgate serve` generates the quickstart sample data on first start
COPY policies ./policies

RUN useradd --system --uid 10001 --home-dir /app dpgate \
    && mkdir -p /data \
    && chown -R dpgate:dpgate /app /data
USER dpgate

ENV DPGATE_POLICIES=/app/policies \
    DPGATE_HOME=/data \
    DPGATE_HOST=0.0.0.0 \
    DPGATE_PORT=8000

EXPOSE 8000
CMD ["dpgate", "serve", "--host", "0.0.0.0"]
