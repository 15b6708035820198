#!/usr/bin/env bash
# Points the caches that libraries would make in the home folder inside the venv instead, for
# every Python of VENV: a .pth line that starts with `import` runs at each interpreter's start.
#
#   scripts/write_home_pth.sh VENV
#
# Each variable is set only when unset, so a user's own choice wins:
# - KERAS_HOME: TensorFlow's Keras makes ~/.keras when it is imported;
# - MPLCONFIGDIR: matplotlib makes ~/.cache/matplotlib and ~/.config/matplotlib;
# - MESA_SHADER_CACHE_DIR: Mesa's EGL (llvmpipe, how MuJoCo renders on a machine without a
#   GPU) keeps compiled shaders in $XDG_CACHE_HOME/mesa_shader_cache, else in
#   <home>/.cache/mesa_shader_cache, where <home> comes from the password database, not
#   $HOME. The cache stays (in the venv): it saves about 0.7 s at each rendering process's
#   first frame (measured on the 2-core CPU machine, Mesa 22.3).
# - CUDA_CACHE_PATH: the NVIDIA driver keeps kernels it compiles from PTX in ~/.nv/ComputeCache
#   (seen on an H200, 2026-11-27: a jitted JAX function made it; with this variable set, it
#   went there instead and HOME stayed empty);
# - __GL_SHADER_DISK_CACHE_PATH: the NVIDIA driver's OpenGL/EGL shader cache (MuJoCo rendering
#   on a GPU), which the same H200's runs left in ~/.cache/nvidia/GLCache; its redirection by
#   this variable (NVIDIA's documented one) is not yet seen.
# Called by scripts/setup_venv.sh and scripts/setup_venv312.sh.
set -euo pipefail
venv=$1
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -f "$site/magi_lp_keras_home.pth"  # this file's name before matplotlib joined it
{
    printf 'import os, sys; '
    printf 'os.environ.setdefault("KERAS_HOME", os.path.join(sys.prefix, "keras")); '
    printf 'os.environ.setdefault("MPLCONFIGDIR", os.path.join(sys.prefix, "matplotlib")); '
    printf 'os.environ.setdefault("MESA_SHADER_CACHE_DIR", os.path.join(sys.prefix, "mesa_shader_cache")); '
    printf 'os.environ.setdefault("CUDA_CACHE_PATH", os.path.join(sys.prefix, "nvidia", "ComputeCache")); '
    printf 'os.environ.setdefault("__GL_SHADER_DISK_CACHE_PATH", os.path.join(sys.prefix, "nvidia", "GLCache"))\n'
} >"$site/magi_lp_home.pth"
