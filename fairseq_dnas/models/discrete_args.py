"""Flags of the discrete-attention models (J. Kinley, 2020), shared by the
single-stream and the two-stream architectures.

    --gumbel-temperature T          tau of the relaxed sample (default 1, the thesis's value, Section 5.3)
    --gumbel-hard                   straight-through: one-hot forward, relaxed gradient
    --gumbel-anneal START,END,UPDATES  geometric annealing of tau (replaces --gumbel-temperature)
    --discrete-scheme {unas,dnas}   the distribution sampled from: softmax(L) (the thesis) or
                                    the DNAS probabilities (Ding et al., 2020; encoder self-attention only)
    --discrete-sampler {gumbel,soft}  gumbel: the discrete model; soft: S = A = softmax(L)
                                    (then the single-stream model is fairseq's transformer)
    --sinkhorn-iters N              DNAS rounds, with --discrete-scheme dnas only

The receptive-field penalty of the thesis's appendix is a criterion, not a
model flag: ``--criterion <base>_rf_penalty --receptive-field-penalty C``
(``fairseq_dnas.criterions.receptive_field_penalty``).

Defaults are set by ``discrete_defaults`` (called by the architecture
functions, as fairseq sets defaults); ``validate_discrete_args`` raises a
one-line ``BadFlag`` at build time. The temperature reaches the attention
modules through the model's ``set_num_updates`` (``apply_temperature``).
"""

from fairseq.logging import metrics
from fairseq.utils import safe_getattr

from fairseq_dnas.attention.discrete import DISCRETE_SCHEMES, SAMPLERS
from fairseq_dnas.attention.gumbel_schedule import GumbelSchedule, check_temperature
from fairseq_dnas.attention.functional import check_sinkhorn_iters
from fairseq_dnas.errors import BadFlag

TEMPERATURE_METRIC = "gumbel_tau"


# (flag, argparse keywords); defaults are set by ``discrete_defaults``.
FLAGS = (
    ("--gumbel-temperature", dict(
        type=float, metavar="T",
        help="Gumbel-softmax temperature tau during training (the thesis: 1); inference takes the argmax")),
    ("--gumbel-hard", dict(
        action="store_true",
        help="straight-through Gumbel-softmax: one-hot attention in the forward, the relaxed sample's gradient")),
    ("--gumbel-anneal", dict(
        type=str, metavar="START,END,UPDATES",
        help="anneal tau geometrically from START to END over UPDATES updates (then stay at END); "
             "replaces --gumbel-temperature")),
    ("--discrete-scheme", dict(
        choices=DISCRETE_SCHEMES,
        help="distribution each attention row samples from: unas = softmax(L) (the thesis), "
             "dnas = doubly-normalized probabilities (encoder self-attention only)")),
    ("--discrete-sampler", dict(
        choices=SAMPLERS, help="gumbel: sample (argmax at inference); soft: S = softmax(L), no sampling")),
    ("--sinkhorn-iters", dict(
        type=int, metavar="N",
        help="column/row normalization rounds of --discrete-scheme dnas (1 = Ding et al.'s DNAS)")),
)


def add_discrete_args(parser, sinkhorn: bool = True) -> None:
    """The discrete-attention flags (defaults in ``discrete_defaults``).
    ``sinkhorn=False`` leaves out ``--sinkhorn-iters`` for a parser that
    already has it."""
    for flag, kwargs in FLAGS:
        if sinkhorn or flag != "--sinkhorn-iters":
            parser.add_argument(flag, **kwargs)


def discrete_defaults(args, sampler: str = "gumbel") -> None:
    """Every discrete flag's default, where the command line left it unset."""
    args.gumbel_temperature = safe_getattr(args, "gumbel_temperature", 1.0)
    args.gumbel_hard = safe_getattr(args, "gumbel_hard", False)
    args.gumbel_anneal = safe_getattr(args, "gumbel_anneal", None)
    args.discrete_scheme = safe_getattr(args, "discrete_scheme", "unas")
    args.discrete_sampler = safe_getattr(args, "discrete_sampler", sampler)
    args.sinkhorn_iters = safe_getattr(args, "sinkhorn_iters", 1)


def validate_discrete_args(args) -> None:
    """BadFlag (one line, saying what to change) for settings that cannot run."""
    try:
        check_temperature(args.gumbel_temperature)
    except ValueError as err:
        raise BadFlag(str(err)) from None
    if args.gumbel_anneal:
        try:
            GumbelSchedule.parse(args.gumbel_anneal)
        except ValueError as err:
            raise BadFlag(str(err)) from None
        if args.gumbel_temperature != 1.0:
            raise BadFlag(
                "--gumbel-anneal START,END,UPDATES sets the temperature itself; "
                "drop --gumbel-temperature (or drop --gumbel-anneal)"
            )
    if args.discrete_scheme not in DISCRETE_SCHEMES:
        raise BadFlag(
            f"--discrete-scheme {args.discrete_scheme!r} is unknown; choose one of {', '.join(DISCRETE_SCHEMES)}"
        )
    if args.discrete_sampler not in SAMPLERS:
        raise BadFlag(f"--discrete-sampler {args.discrete_sampler!r} is unknown; choose one of {', '.join(SAMPLERS)}")
    try:
        check_sinkhorn_iters(args.sinkhorn_iters)
    except ValueError:
        raise BadFlag(f"--sinkhorn-iters must be an integer >= 1; got {args.sinkhorn_iters!r}") from None
    if args.sinkhorn_iters > 1 and args.discrete_scheme != "dnas":
        raise BadFlag(
            f"--sinkhorn-iters {args.sinkhorn_iters} only changes --discrete-scheme dnas; "
            "add --discrete-scheme dnas or drop --sinkhorn-iters"
        )


def temperature_at(args, num_updates: int) -> float:
    """tau for the next update: the annealing schedule's, else --gumbel-temperature."""
    if args.gumbel_anneal:
        return GumbelSchedule.parse(args.gumbel_anneal)(num_updates)
    return float(args.gumbel_temperature)


def build_discrete_model(build, args, task, defaults, validate):
    """The translation models' ``build_model``: ``defaults(args)`` (args that
    come without an --arch: hub, old configs), ``validate(args)`` (BadFlag),
    ``build(args, task)`` (fairseq's), then tau at update 0."""
    defaults(args)
    validate(args)
    model = build(args, task)
    apply_temperature(model, args, 0, log=False)
    return model


def apply_temperature(model, args, num_updates: int, log: bool) -> float:
    """Set tau on every module of ``model`` with a ``gumbel_temperature``
    attribute; with ``log``, log it as the metric ``gumbel_tau`` (the latest
    value per log interval, weight 0, as transformer_hnas logs u).

    Called from the models' ``set_num_updates``, which fairseq's trainer calls
    after loading a checkpoint and after every update, so a resumed run
    continues the schedule where it stopped. It also records the count as
    ``model.num_updates``: the receptive-field penalty's
    ``--receptive-field-penalty-start`` reads it (fairseq hands the update
    number to the model, never to the criterion).
    """
    model.num_updates = int(num_updates)
    tau = temperature_at(args, num_updates)
    for m in model.modules():
        if hasattr(m, "gumbel_temperature"):
            m.gumbel_temperature = tau
    if log:
        metrics.log_scalar(TEMPERATURE_METRIC, tau, weight=0, priority=890, round=4)
    return tau
