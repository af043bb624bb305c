# Rendered by imagekit 0.1.0 for cu121-torch2.1.2-py3.11-tf4.48.2 (lock 53f0b543e4f4).
# Do not edit: `imagekit render` regenerates this file and `imagekit render --check` detects edits.
# Builder: the engine's legacy builder, through `imagekit build`, which serves the locked wheels over loopback HTTP.
# ---- base stage: debian-bookworm (imagekit/base:debian-bookworm-b3d205b2bb36) ----
FROM imagekit/base:debian-bookworm-b3d205b2bb36 AS base
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
 && /usr/bin/python3.11 -m venv /opt/venv \
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

# ---- cell stage: cu121-torch2.1.2-py3.11-tf4.48.2 ----
# No ARG and no COPY before a layer: on the legacy builder every instruction is a container commit (seconds each).
# Each layer's requirements come with the wheels (the wheel server), named with their sha256 (the step's
# cache key and a check). uv (0.13.9) comes from there too, checked by hash; it leaves no trace.
FROM base AS image
# Layer 1: CUDA toolkit libraries (10 distributions; Python-independent, in /opt/cuda-libs).
RUN export SOURCE_DATE_EPOCH=1735689600 \
 && /opt/imagekit/bin/install-layer --wheels http://imagekit-wheels:8765/ --uv uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl#sha256=d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19 \
      --requirements http://imagekit-wheels:8765/requirements-cuda-toolkit.txt#sha256=87c26e4d91a96aeadeda00440a3410446d6cbf29c178b4a303b755e156ecc42e \
      --target /opt/cuda-libs \
 && /opt/imagekit/bin/finalize-layer /opt/cuda-libs /opt/imagekit
# Layer 2: CUDA library cudnn (1 distribution; Python-independent, in /opt/cuda-libs).
RUN export SOURCE_DATE_EPOCH=1735689600 \
 && /opt/imagekit/bin/install-layer --wheels http://imagekit-wheels:8765/ --uv uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl#sha256=d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19 \
      --requirements http://imagekit-wheels:8765/requirements-cuda-cudnn.txt#sha256=da8bb77d8b9a0636d9e380ab385aace2f991a6d1621434f6037a147a73ffcb41 \
      --target /opt/cuda-libs \
 && /opt/imagekit/bin/finalize-layer /opt/cuda-libs /opt/imagekit
# Layer 3: CUDA library nccl (1 distribution; Python-independent, in /opt/cuda-libs).
RUN export SOURCE_DATE_EPOCH=1735689600 \
 && /opt/imagekit/bin/install-layer --wheels http://imagekit-wheels:8765/ --uv uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl#sha256=d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19 \
      --requirements http://imagekit-wheels:8765/requirements-cuda-nccl.txt#sha256=62aff90f4eb5fd4618f1539d7795bc6388c8f79fcc2539f860635614cc077dd2 \
      --target /opt/cuda-libs \
 && /opt/imagekit/bin/finalize-layer /opt/cuda-libs /opt/imagekit
# Layer 4: torch and its closure (10 distributions).
RUN export SOURCE_DATE_EPOCH=1735689600 \
 && /opt/imagekit/bin/install-layer --wheels http://imagekit-wheels:8765/ --uv uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl#sha256=d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19 \
      --requirements http://imagekit-wheels:8765/requirements-torch.txt#sha256=ccaeb922c23d39421a3ed55e36954d758dde2a8fe789bdafefa8c52a2c2700fb \
      --venv /opt/venv --link-from /opt/cuda-libs --compile \
 && /opt/imagekit/bin/finalize-layer /opt/venv /opt/imagekit
# Layer 5: everything else (17 distributions), with the doctor, the entrypoint, the
# shell/sshd settings, the manifest and every layer's requirements (rootfs/app/ as app-files.tar from the wheel server:
# one RUN after the big layers, not a COPY and a RUN).
RUN export SOURCE_DATE_EPOCH=1735689600 \
 && /opt/imagekit/bin/install-layer --wheels http://imagekit-wheels:8765/ --uv uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl#sha256=d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19 \
      --requirements http://imagekit-wheels:8765/requirements-app.txt#sha256=e70cce47bdf3a37d6018a398011902be1221b8b98401748361ad344502811c3a \
      --venv /opt/venv --compile \
      --files http://imagekit-wheels:8765/app-files.tar#sha256=<sha256 of app-files.tar> \
 && /opt/imagekit/bin/finalize-layer /opt/venv /opt/imagekit
# The image's runtime config: `imagekit build` sets it on the built image, with no container commit (each Dockerfile
# instruction is one on the legacy builder, 10-20 s over the whole tree); `docker history` shows it as the last step.
#   ENV LANG="C.UTF-8" \
#       PYTHONUNBUFFERED="1" \
#       PIP_NO_CACHE_DIR="1" \
#       PIP_DISABLE_PIP_VERSION_CHECK="1" \
#       PIP_CONSTRAINT="/opt/imagekit/constraints.txt" \
#       UV_CONSTRAINT="/opt/imagekit/constraints.txt" \
#       VIRTUAL_ENV="/opt/venv" \
#       PATH="/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
#       NVIDIA_VISIBLE_DEVICES="all" \
#       NVIDIA_DRIVER_CAPABILITIES="compute,utility" \
#       HF_HOME="/workspace/.cache/huggingface" \
#       IMAGEKIT_MANIFEST="/etc/imagekit/manifest.json"
#   WORKDIR /workspace
#   ENTRYPOINT ["/opt/imagekit/bin/entrypoint"]
#   CMD []
#   LABEL "imagekit.archs"="sm_50,sm_60,sm_70,sm_75,sm_80,sm_86,sm_90" \
#       "imagekit.cell"="cu121-torch2.1.2-py3.11-tf4.48.2" \
#       "imagekit.cuda"="12.1" \
#       "imagekit.driver.min"="525.60.13" \
#       "imagekit.lock.hash"="53f0b543e4f4b685d6454f288a1198ae19a3d718164325bbfc5647de8ba1bc6e" \
#       "imagekit.python"="3.11" \
#       "imagekit.runtime"="driver_min=525.60.13 cuda=12.1 cuda_major=12 sass=sm_50,sm_60,sm_70,sm_75,sm_80,sm_86,sm_90 ptx= platform=linux/amd64 glibc_min=2.17" \
#       "imagekit.torch"="2.1.2" \
#       "imagekit.torch.cuda"="12.1" \
#       "imagekit.torch.version"="2.1.2" \
#       "imagekit.transformers"="4.48.2" \
#       "imagekit.version"="0.1.0" \
#       "org.opencontainers.image.base.digest"="" \
#       "org.opencontainers.image.base.name"="imagekit/base:debian-bookworm-b3d205b2bb36" \
#       "org.opencontainers.image.description"="torch 2.1.2+cu121, transformers 4.48.2, Python 3.11" \
#       "org.opencontainers.image.revision"="unknown" \
#       "org.opencontainers.image.title"="imagekit cu121-torch2.1.2-py3.11-tf4.48.2" \
#       "org.opencontainers.image.vendor"="imagekit" \
#       "org.opencontainers.image.version"="cu121-torch2.1.2-py3.11-tf4.48.2-53f0b543e4f4"
