# Rendered by imagekit 0.1.0 for cu130-torch2.14.1-py3.13-tf5.24.0 (lock 0a31b14b70dd).
# Do not edit: `imagekit render` regenerates this file and `imagekit render --check` detects edits.
# Builder: BuildKit (docker buildx build/bake, or DOCKER_BUILDKIT=1 docker build). The locked wheels are bind-mounted
# from ./wheels (`imagekit fetch --into DIR` puts them there): never copied into a layer. No network needed.
# ---- base stage: debian-trixie (imagekit/base:x) ----
FROM imagekit/base:x AS base
# The two scripts the layers below run (every COPY brings a folder laid out as in the image: see render.py).
COPY rootfs/base/ /
# `python -m venv` seeds pip (and setuptools before Python 3.12). No layer replaces a seed (the seed's files would stay
# in the layer below, hidden by whiteouts the legacy builder dates with the build's time): the venv keeps no seed the
# lock pins, so each locked distribution is installed once, by its layer. A seed the lock does not pin stays (pip for
# users and the image's pip wrapper; setuptools, which torch's compiler imports on older torch) and the manifest
# declares it (python.seeds) as not from the lock.
# The CUDA runtime layers go to /opt/cuda-libs (no Python-specific file): the venv sees it through a .pth (imports,
# package metadata), and the torch layer links each folder there into site-packages (nvidia/, cusparselt/, ...), so
# torch's RPATH ($ORIGIN/../../nvidia/cublas/lib, $ORIGIN/../../cusparselt/lib) resolves as from site-packages.
RUN export SOURCE_DATE_EPOCH=1735689600 \
 && /usr/bin/python3.13 -m venv /opt/venv \
 && /opt/venv/bin/python -m pip uninstall --yes -qq setuptools \
 && /opt/venv/bin/python -m pip --version \
 && site=$(/opt/venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") \
 && mkdir -p /opt/cuda-libs \
 && echo /opt/cuda-libs > "$site/imagekit-cuda-libs.pth" \
 && groupadd --gid 1000 imagekit \
 && useradd --uid 1000 --gid 1000 --create-home --shell /bin/bash imagekit \
 && mkdir -p /workspace /etc/imagekit /run/imagekit \
 && install -d -m 700 /root/.ssh \
 && ln -s /opt/imagekit/etc/profile.sh /etc/profile.d/imagekit.sh \
 && ln -s /opt/imagekit/bin/imagekit-doctor /usr/local/bin/imagekit-doctor \
 && ln -s /opt/imagekit/manifest.json /etc/imagekit/manifest.json \
 && printf '\n# imagekit: interactive shells are the image environment too\nif [ -r /opt/imagekit/etc/profile.sh ]; then . /opt/imagekit/etc/profile.sh; fi\n' >> /etc/bash.bashrc \
 && /opt/imagekit/bin/finalize-layer /opt/venv /opt/imagekit /opt/cuda-libs /workspace /home/imagekit /etc/imagekit /root /run /usr/local

# ---- cell stage: cu130-torch2.14.1-py3.13-tf5.24.0 ----
# No ARG and no COPY before a layer: on the legacy builder every instruction is a container commit (seconds each).
# Each layer's requirements come with the wheels (./wheels, bind-mounted), named with their sha256 (the step's
# cache key and a check). uv (0.13.9) comes from there too, checked by hash; it leaves no trace.
FROM base AS image
# Layer 1: CUDA toolkit libraries (11 distributions; Python-independent, in /opt/cuda-libs).
RUN --mount=type=bind,source=wheels,target=/mnt,readonly \
    export SOURCE_DATE_EPOCH=1735689600 \
 && /opt/imagekit/bin/install-layer --wheels /mnt --uv uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl#sha256=d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19 \
      --requirements /mnt/requirements-cuda-toolkit.txt#sha256=00eb6135e9b15fad732a61e9c43c6ae7685bb0b1b97d9edc60fc23d571a95a87 \
      --target /opt/cuda-libs \
 && /opt/imagekit/bin/finalize-layer /opt/cuda-libs /opt/imagekit
# Layer 2: CUDA library cudnn (1 distribution; Python-independent, in /opt/cuda-libs).
RUN --mount=type=bind,source=wheels,target=/mnt,readonly \
    export SOURCE_DATE_EPOCH=1735689600 \
 && /opt/imagekit/bin/install-layer --wheels /mnt --uv uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl#sha256=d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19 \
      --requirements /mnt/requirements-cuda-cudnn.txt#sha256=8a65ee4c603acacd9921cd8f340f0a165412830c449008e0922a5edf62aace1d \
      --target /opt/cuda-libs \
 && /opt/imagekit/bin/finalize-layer /opt/cuda-libs /opt/imagekit
# Layer 3: CUDA library nccl (1 distribution; Python-independent, in /opt/cuda-libs).
RUN --mount=type=bind,source=wheels,target=/mnt,readonly \
    export SOURCE_DATE_EPOCH=1735689600 \
 && /opt/imagekit/bin/install-layer --wheels /mnt --uv uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl#sha256=d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19 \
      --requirements /mnt/requirements-cuda-nccl.txt#sha256=8d6228c903385d87f3e7fd4acb5e2cdf9317b4807c1e49fc8d64a3ba44559277 \
      --target /opt/cuda-libs \
 && /opt/imagekit/bin/finalize-layer /opt/cuda-libs /opt/imagekit
# Layer 4: CUDA library cusparselt (1 distribution; Python-independent, in /opt/cuda-libs).
RUN --mount=type=bind,source=wheels,target=/mnt,readonly \
    export SOURCE_DATE_EPOCH=1735689600 \
 && /opt/imagekit/bin/install-layer --wheels /mnt --uv uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl#sha256=d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19 \
      --requirements /mnt/requirements-cuda-cusparselt.txt#sha256=74205c4b0419a4ef578d55d4ef2697a24f6b68e4042c87ab159758c1aa1ed3b8 \
      --target /opt/cuda-libs \
 && /opt/imagekit/bin/finalize-layer /opt/cuda-libs /opt/imagekit
# Layer 5: CUDA library nvshmem (1 distribution; Python-independent, in /opt/cuda-libs).
RUN --mount=type=bind,source=wheels,target=/mnt,readonly \
    export SOURCE_DATE_EPOCH=1735689600 \
 && /opt/imagekit/bin/install-layer --wheels /mnt --uv uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl#sha256=d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19 \
      --requirements /mnt/requirements-cuda-nvshmem.txt#sha256=bc0c09f3d655bb21f39eb76329833039fdc514bcea11f50da361e6330b7a51ca \
      --target /opt/cuda-libs \
 && /opt/imagekit/bin/finalize-layer /opt/cuda-libs /opt/imagekit
# Layer 6: CUDA compiler: nvcc, cicc, the CUDA headers (4 distributions; Python-independent, in /opt/cuda-libs).
RUN --mount=type=bind,source=wheels,target=/mnt,readonly \
    export SOURCE_DATE_EPOCH=1735689600 \
 && /opt/imagekit/bin/install-layer --wheels /mnt --uv uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl#sha256=d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19 \
      --requirements /mnt/requirements-cuda-compiler.txt#sha256=d4f536f40febbbe4a5274eb334a5081d5b0071f0e08954dd9cdfc520a709adb1 \
      --target /opt/cuda-libs \
 && /opt/imagekit/bin/finalize-layer /opt/cuda-libs /opt/imagekit
# Layer 7: torch and its closure (14 distributions).
RUN --mount=type=bind,source=wheels,target=/mnt,readonly \
    export SOURCE_DATE_EPOCH=1735689600 \
 && /opt/imagekit/bin/install-layer --wheels /mnt --uv uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl#sha256=d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19 \
      --requirements /mnt/requirements-torch.txt#sha256=081af2fa901ae6f61393fc642701054c8e22fce160373631d2da4033e15c91e9 \
      --venv /opt/venv --link-from /opt/cuda-libs --compile \
 && /opt/imagekit/bin/finalize-layer /opt/venv /opt/imagekit
# Layer 8: everything else (29 distributions), with the doctor, the entrypoint, the
# shell/sshd settings, the manifest and every layer's requirements (rootfs/app/: one COPY and one RUN after the big
# layers).
COPY rootfs/app/ /
RUN --mount=type=bind,source=wheels,target=/mnt,readonly \
    export SOURCE_DATE_EPOCH=1735689600 \
 && /opt/imagekit/bin/install-layer --wheels /mnt --uv uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl#sha256=d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19 \
      --requirements /mnt/requirements-app.txt#sha256=2eb4fee3f213462a6e62227d772c78ee80c98e300ebb6af6396cf22a1a79f7d2 \
      --venv /opt/venv --compile \
 && /opt/imagekit/bin/finalize-layer /opt/venv /opt/imagekit
# The image's runtime config, last: free on BuildKit (no commit), and no RUN above sees it.
ENV LANG="C.UTF-8" \
    PYTHONUNBUFFERED="1" \
    PIP_NO_CACHE_DIR="1" \
    PIP_DISABLE_PIP_VERSION_CHECK="1" \
    PIP_CONSTRAINT="/opt/imagekit/constraints.txt" \
    UV_CONSTRAINT="/opt/imagekit/constraints.txt" \
    VIRTUAL_ENV="/opt/venv" \
    PATH="/opt/venv/bin:/opt/cuda-libs/nvidia/cu13/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    NVIDIA_VISIBLE_DEVICES="all" \
    NVIDIA_DRIVER_CAPABILITIES="compute,utility" \
    HF_HOME="/workspace/.cache/huggingface" \
    IMAGEKIT_MANIFEST="/etc/imagekit/manifest.json" \
    CUDA_HOME="/opt/cuda-libs/nvidia/cu13"
WORKDIR /workspace
ENTRYPOINT ["/opt/imagekit/bin/entrypoint"]
CMD []
LABEL "imagekit.archs"="sm_75,sm_80,sm_86,sm_90,sm_100,sm_120" \
    "imagekit.cell"="cu130-torch2.14.1-py3.13-tf5.24.0" \
    "imagekit.cuda"="13.0" \
    "imagekit.driver.min"="580.65.06" \
    "imagekit.lock.hash"="0a31b14b70dd803bfd2d90d8a3d775b7a0a7de7fe2654681a414a241ab445b8f" \
    "imagekit.python"="3.13" \
    "imagekit.runtime"="driver_min=580.65.06 cuda=13.0 cuda_major=13 sass=sm_75,sm_80,sm_86,sm_90,sm_100,sm_120 ptx= platform=linux/amd64 glibc_min=2.28" \
    "imagekit.torch"="2.14.1" \
    "imagekit.torch.cuda"="13.0" \
    "imagekit.torch.version"="2.14.1" \
    "imagekit.transformers"="5.24.0" \
    "imagekit.version"="0.1.0" \
    "org.opencontainers.image.base.digest"="" \
    "org.opencontainers.image.base.name"="imagekit/base:x" \
    "org.opencontainers.image.description"="torch 2.14.1+cu130, transformers 5.24.0, Python 3.13" \
    "org.opencontainers.image.revision"="unknown" \
    "org.opencontainers.image.title"="imagekit cu130-torch2.14.1-py3.13-tf5.24.0" \
    "org.opencontainers.image.vendor"="imagekit" \
    "org.opencontainers.image.version"="cu130-torch2.14.1-py3.13-tf5.24.0-0a31b14b70dd"
