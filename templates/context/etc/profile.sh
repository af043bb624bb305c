# imagekit: every shell is the image's environment. Sourced by login shells (/etc/profile.d/imagekit.sh) and
# interactive bash (/etc/bash.bashrc): SSH sessions, web terminals, tmux and `docker exec` all get the venv first on
# PATH and the container's env, which pod platforms hand to PID 1 only (the entrypoint saves it, readable by root).
if [ -r /etc/imagekit/env.sh ]; then
  . /etc/imagekit/env.sh
fi
case ":${PATH:-}:" in
  :/opt/venv/bin:*) ;;
  *) PATH="/opt/venv/bin:${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}" ;;
esac
VIRTUAL_ENV=/opt/venv
export PATH VIRTUAL_ENV
case "$-" in
  *i*)
    if [ -r /run/imagekit/blocked ] && [ -z "${IMAGEKIT_BANNER_SHOWN:-}" ]; then
      cat /run/imagekit/blocked >&2
      IMAGEKIT_BANNER_SHOWN=1
    fi
    ;;
esac
