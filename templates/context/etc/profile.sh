# imagekit: every shell is the image's environment. Sourced by login shells (/etc/profile.d/imagekit.sh) and
# interactive bash (/etc/bash.bashrc): SSH sessions, web terminals, tmux and `docker exec` all get the venv first on
# PATH and the container's env, which pod platforms hand to PID 1 only (the entrypoint saves it, readable by root).
# Once per session tree: a nested shell keeps what the user changed (another venv first on PATH, their HF_HOME).
if [ -z "${IMAGEKIT_ENV_LOADED:-}" ] && [ -r /etc/imagekit/env.sh ]; then
  . /etc/imagekit/env.sh
  IMAGEKIT_ENV_LOADED=1
  export IMAGEKIT_ENV_LOADED
fi
# Login shells start from Debian's PATH (/etc/profile resets it): put the venv back unless it is already there.
case ":${PATH:-}:" in
  *:/opt/venv/bin:*) ;;
  *) PATH="/opt/venv/bin:${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}"
     VIRTUAL_ENV=/opt/venv
     export PATH VIRTUAL_ENV ;;
esac
case "$-" in
  *i*)
    if [ -z "${IMAGEKIT_BANNER_SHOWN:-}" ]; then
      # the start check's blocker; the lifetime guard's warning (a process on the CPU while every GPU idles)
      for f in /run/imagekit/blocked /run/imagekit/guard-warning; do
        if [ -r "$f" ]; then cat "$f" >&2; IMAGEKIT_BANNER_SHOWN=1; fi
      done
    fi
    ;;
esac
