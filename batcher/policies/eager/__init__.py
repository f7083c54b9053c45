"""The default policy (``eager``) as parts: policy.py holds ``EagerBatching`` and says what each module holds."""

from .decoder import ADMISSION_RULES, JOIN_RULES, DecoderAdmission
from .policy import INLINE_ANSWERS_KEPT, INLINE_RATE_LOG_STEP, EagerBatching
from .preemption import DEFAULT_MIN_GAIN, TAIL_PASSES, PreemptionRule
from .rates import BACK_TO_BACK_S, RATE_MIN_PASSES, RATE_WINDOW_MIN_S, RATE_WINDOW_PASSES, ArrivalRates
from .urgency import URGENT_ALONE, UrgencyRule, class_key
from .work_conserving import MAX_UTILISATION, WorkConserving

__all__ = ["EagerBatching", "ArrivalRates", "WorkConserving", "PreemptionRule", "UrgencyRule", "DecoderAdmission",
           "class_key", "ADMISSION_RULES", "JOIN_RULES", "DEFAULT_MIN_GAIN", "TAIL_PASSES", "MAX_UTILISATION",
           "URGENT_ALONE", "BACK_TO_BACK_S", "RATE_MIN_PASSES", "RATE_WINDOW_MIN_S", "RATE_WINDOW_PASSES",
           "INLINE_ANSWERS_KEPT", "INLINE_RATE_LOG_STEP"]
