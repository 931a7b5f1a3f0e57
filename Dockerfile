FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY executor ./executor
COPY agent_client ./agent_client
COPY tasks ./tasks
RUN pip install --no-cache-dir -e . flower
USER nobody
