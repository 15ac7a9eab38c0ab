"""fairseq_dnas.hf.enable's settings: each scheme takes only the settings it
reads (a setting that would do nothing is a one-line ValueError), config.dnas
records only those, folders saved with every setting still load, and
hf.from_pretrained loads without transformers' alarm about the HNAS weights
it restores itself (only those), or says in one line that the folder is
missing."""

import json

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, BertModel

from fairseq_dnas import hf

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, vocab_size=99,
             max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def bert():
    torch.manual_seed(0)
    return BertModel(BertConfig(**SMALL))


@pytest.mark.parametrize("scheme, setting, applies_to", [
    ("dnas", {"gumbel_hard": True}, "scheme='discrete'"),
    ("hnas", {"gumbel_temperature": 0.5}, "scheme='discrete'"),
    ("dnas", {"hybrid_init": 0.3}, "scheme='hnas'"),
    ("dnas", {"per": "layer"}, "scheme='hnas'"),
    ("discrete", {"hybrid_init": 0.3}, "scheme='hnas'"),
    ("unas", {"gumbel_hard": False}, "scheme='discrete'"),
])
def test_a_setting_the_scheme_does_not_read_is_refused(scheme, setting, applies_to):
    model = bert()
    (name, value), = setting.items()
    with pytest.raises(ValueError) as e:
        hf.enable(model, scheme=scheme, **setting)
    assert str(e.value) == (f"{name}={value!r} does nothing with scheme={scheme!r}: it applies to {applies_to} "
                            "only; drop it")
    assert model.config._attn_implementation != scheme and not hasattr(model.config, "dnas")  # nothing changed


@pytest.mark.parametrize("scheme, kwargs, recorded", [
    ("dnas", {}, {"scheme": "dnas"}),
    ("unas", {}, {"scheme": "unas"}),
    ("hnas", {}, {"scheme": "hnas", "hybrid_init": 0.5, "per": "head"}),
    ("hnas", {"hybrid_init": 0.2, "per": "layer"}, {"scheme": "hnas", "hybrid_init": 0.2, "per": "layer"}),
    ("discrete", {}, {"scheme": "discrete", "gumbel_temperature": 1.0, "gumbel_hard": False}),
    ("discrete", {"gumbel_temperature": 2, "gumbel_hard": True},
     {"scheme": "discrete", "gumbel_temperature": 2.0, "gumbel_hard": True}),
])
def test_config_records_only_the_settings_the_scheme_reads(tmp_path, scheme, kwargs, recorded):
    model = hf.enable(bert(), scheme=scheme, **kwargs)
    assert model.config.dnas == recorded
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dnas"] == recorded
    assert hf.from_pretrained(BertModel, str(tmp_path)).config.dnas == recorded


def test_a_folder_saved_with_every_setting_still_loads(tmp_path):
    """Folders written before the settings were checked record hybrid_init
    and per for every scheme: those are dropped on load."""
    hf.enable(bert(), scheme="discrete", gumbel_temperature=0.5).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["dnas"].update(hybrid_init=0.5, per="head")
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = hf.from_pretrained(BertModel, str(tmp_path))
    assert loaded.config.dnas == {"scheme": "discrete", "gumbel_temperature": 0.5, "gumbel_hard": False}
    assert loaded.config._attn_implementation == "discrete"


def test_from_pretrained_of_a_missing_folder_is_one_line(tmp_path):
    with pytest.raises(ValueError) as e:
        hf.from_pretrained(BertModel, str(tmp_path / "nowhere"))
    assert str(e.value) == (f"{tmp_path / 'nowhere'} is not a folder: hf.from_pretrained loads the folder that "
                            "save_pretrained wrote after fairseq_dnas.hf.enable")


@pytest.fixture
def transformers_warnings():
    """transformers' warnings on, whatever an earlier test in this process set (the faithfulness
    command turns them down to errors)."""
    import transformers

    before = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_warning()
    yield
    transformers.logging.set_verbosity(before)


def test_hf_from_pretrained_does_not_report_the_hnas_weights_it_restores(tmp_path, caplog, transformers_warnings):
    model = hf.enable(BertForSequenceClassification(BertConfig(**SMALL)), scheme="hnas", hybrid_init=0.3)
    model.save_pretrained(tmp_path)
    caplog.clear()
    loaded = hf.from_pretrained(BertForSequenceClassification, str(tmp_path))
    assert "LOAD REPORT" not in caplog.text
    assert hf.hybrid_weights(loaded).means == pytest.approx([0.3, 0.3])
    # the class is as it was: a plain load still reports the weights it drops ...
    assert "_keys_to_ignore_on_load_unexpected" not in vars(BertForSequenceClassification)
    BertForSequenceClassification.from_pretrained(str(tmp_path))
    err, _ = caplog.text, caplog.clear()
    assert "LOAD REPORT" in err and "hybrid_logit" in err and "UNEXPECTED" in err
    # ... and hf.from_pretrained still reports any other key it does not expect
    state = {k: v for k, v in loaded.state_dict().items()}
    state["bert.extra.weight"] = torch.zeros(2)
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"),
              metadata={"format": "pt"})
    hf.from_pretrained(BertForSequenceClassification, str(tmp_path))
    err = caplog.text
    assert "bert.extra.weight" in err and "hybrid_logit" not in err


# -- the labelled TSV of hf_faithfulness and sentence_classify -------------------------------------

def test_a_tsv_with_the_label_first_says_the_columns_look_swapped(tmp_path):
    from fairseq_dnas.commands.sentence_classify import BadInput, read_labelled

    swapped = tmp_path / "swapped.tsv"
    swapped.write_text("label\tsentence\n1\ta fine film\n0\ta dull one\n")
    with pytest.raises(BadInput) as e:
        read_labelled(str(swapped), ["0", "1"])
    assert str(e.value) == (f"{swapped}:2: the columns look swapped: '1' first is a label the model knows; "
                            "give 'sentence<TAB>label' a line")
    unknown = tmp_path / "unknown.tsv"
    unknown.write_text("a fine film\tpositive\n")
    with pytest.raises(BadInput, match=r"label 'positive' is not one the model knows \(0, 1\)"):
        read_labelled(str(unknown), ["0", "1"])
    good = tmp_path / "good.tsv"
    good.write_text("sentence\tlabel\na fine film\t1\n2\t0\n")  # a sentence may be a number
    sentences, gold = read_labelled(str(good), ["0", "1"])
    assert sentences == ["a fine film", "2"] and gold.tolist() == [1, 0]


# -- the SST examples' data folders -----------------------------------------------------------------

def _example(name):
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "hf", name)
    spec = importlib.util.spec_from_file_location(name[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return path, module


def test_finetune_sst2_reads_glue_own_layout_and_the_labelled_test_layout(tmp_path, capsys):
    _, finetune = _example("finetune_sst2.py")
    glue = tmp_path / "glue"
    glue.mkdir()
    (glue / "train.tsv").write_text("sentence\tlabel\ngood\t1\n")
    (glue / "dev.tsv").write_text("sentence\tlabel\nfine\t1\ndull\t0\n")
    (glue / "test.tsv").write_text("index\tsentence\n0\tan unlabelled one\n")
    assert finetune.evaluation_file(str(glue)) == str(glue / "dev.tsv")
    assert "GLUE's unlabelled test split" in capsys.readouterr().err
    assert finetune.read_tsv(finetune.evaluation_file(str(glue))) == (["fine", "dull"], [1, 0])
    labelled = tmp_path / "labelled"
    labelled.mkdir()
    (labelled / "test.tsv").write_text("sentence\tlabel\nfine\t1\n")
    (labelled / "dev.tsv").write_text("sentence\tlabel\nphrase\t1\n")
    assert finetune.evaluation_file(str(labelled)) == str(labelled / "test.tsv")


def test_sst_schemes_run_checks_its_data_folder_before_any_run(tmp_path):
    import os
    import subprocess
    import sys

    script, _ = _example("sst_schemes.py")
    env = {k: v for k, v in os.environ.items() if k != "SST_BINARY_DIR"}

    def run(*args):
        return subprocess.run([sys.executable, script, "run", "--out", str(tmp_path / "out"), *args],
                              capture_output=True, text=True, timeout=120, env=env)

    proc = run()
    assert proc.returncode == 1 and proc.stderr.strip() == (
        "error: no data folder: pass --data-dir or set SST_BINARY_DIR to the folder with train.tsv, dev.tsv, test.tsv")
    (tmp_path / "sst").mkdir()
    (tmp_path / "sst" / "train.tsv").write_text("sentence\tlabel\ngood\t1\n")
    proc = run("--data-dir", str(tmp_path / "sst"))
    assert proc.returncode == 1 and proc.stderr.strip().startswith(f"error: {tmp_path / 'sst'} lacks dev.tsv, test.tsv")
    assert "run 1/" not in proc.stdout and not (tmp_path / "out").exists()


def test_a_plain_from_pretrained_of_a_scheme_folder_is_never_a_silent_sdpa_model(tmp_path):
    """config.json names the scheme as transformers' attention implementation:
    DNAS loads as DNAS; HNAS and discrete stop at the first forward with a
    line naming hf.from_pretrained; without fairseq_dnas.hf imported,
    transformers refuses the implementation."""
    import os
    import subprocess
    import sys

    ids = torch.randint(5, 99, (2, 7))
    for scheme in ("dnas", "hnas", "discrete"):
        folder = tmp_path / scheme
        hf.enable(BertForSequenceClassification(BertConfig(**SMALL)), scheme=scheme).save_pretrained(folder)
        assert json.loads((folder / "config.json").read_text())["attn_implementation"] == scheme
        plain = BertForSequenceClassification.from_pretrained(str(folder)).eval()
        assert plain.config._attn_implementation == scheme
        if scheme == "dnas":
            loaded = hf.from_pretrained(BertForSequenceClassification, str(folder)).eval()
            torch.testing.assert_close(plain(input_ids=ids).logits, loaded(input_ids=ids).logits)
        else:
            with pytest.raises(ValueError, match=r"fairseq_dnas\.hf\.from_pretrained") as e:
                plain(input_ids=ids)
            assert "\n" not in str(e.value)
    code = ("from transformers import BertForSequenceClassification as M\n"
            "try:\n    M.from_pretrained(r'%s')\nexcept ValueError as e:\n    print('refused:', e)\n"
            "else:\n    print('loaded')\n") % (tmp_path / "dnas")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ""})
    assert proc.stdout.startswith('refused: Specified `attn_implementation="dnas"` is not supported'), \
        proc.stdout + proc.stderr[-2000:]
