# trainhealth on CPU: the image of docker-compose.yml's trainer (`trainhealth demo`) and, with the
# `gpu` profile, of its node GPU exporter (`trainhealth export`; NVML comes from the host's driver,
# mounted by the NVIDIA Container Toolkit).
#
#   docker build -t trainhealth:local .
#   docker run --rm -p 127.0.0.1:9448:9448 trainhealth:local      # the demo; any subcommand works:
#   docker run --rm trainhealth:local --help
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# torch first, from PyTorch's CPU index: the default (PyPI) wheel bundles CUDA, gigabytes unused here.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

# Then trainhealth with the demo's extras (pip keeps the CPU torch, which satisfies the requirement).
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install '.[demo]' && rm -rf /src

# Run as an unprivileged user. uid 1000 is the usual first user of a Linux host, so a bind-mounted
# ./reports created by that user is writable (docker-compose.yml mounts it at /reports).
RUN useradd --create-home --uid 1000 trainhealth && install -d -o trainhealth /reports
USER trainhealth
WORKDIR /home/trainhealth

# 9448 analyzer, 9450-9453 the demo's ranks (9450 + rank), 9096 Alertmanager webhooks to the demo.
# (`trainhealth export` serves on 9449.)
EXPOSE 9448 9450-9453 9096

ENTRYPOINT ["trainhealth"]
CMD ["demo", "--addr", "0.0.0.0"]
