"""The figures' former single module, kept for old imports: each chapter's figures now live in
:mod:`attn_gym_lite.book.figures` (``ch01_ragged`` ... ``ch10_scale_out``)."""

from .figures.ch01_ragged import *  # noqa: F403
from .figures.ch02_capture import *  # noqa: F403
from .figures.ch03_profiling import *  # noqa: F403
from .figures.ch04_schedulers import *  # noqa: F403
from .figures.ch05_masking import *  # noqa: F403
from .figures.ch06_buckets import *  # noqa: F403
from .figures.ch07_packing import *  # noqa: F403
from .figures.ch08_end_to_end import *  # noqa: F403
from .figures.ch09_linear_attention import *  # noqa: F403
from .figures.ch10_scale_out import *  # noqa: F403
from .figures.style import *  # noqa: F403
