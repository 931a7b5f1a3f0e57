# syntax=docker/dockerfile:1
# toolexec's image: the workers, `toolexec status` and Flower (docker-compose.yml).
#
# What gets installed is what pyproject.toml declares: the build stage makes wheels of
# the project and of every dependency it names (`pip wheel ".[flower]"`), and the
# image installs them, with no compiler and no source tree of the packages. The only
# source copied into the image itself is the example tool module the compose file's
# workers import (examples/my_tools.py, found from the working directory).

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY wire ./wire
COPY executor ./executor
COPY agent_client ./agent_client
COPY toolexec ./toolexec
COPY tasks ./tasks
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[flower]"

FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels "toolexec[flower]" \
    && useradd --system --uid 10001 --home-dir /app toolexec \
    && mkdir -p /data \
    && chown toolexec /data
WORKDIR /app
COPY examples/__init__.py examples/my_tools.py ./examples/
# Workers run as an unprivileged user (Celery warns about a worker that runs as root).
USER toolexec
CMD ["toolexec", "--help"]
