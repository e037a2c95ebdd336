"""Coqui VITS and XTTS with random weights, built from a config and saved like trained ones.

They speak noise, but they go through the very code users' checkpoints go through:
`TTS(model_path=..., config_path=...)` loads the `config.json` and the `{"model": ...}`
checkpoint, tokenizes with the config's characters, and synthesizes.

VITS comes in two sizes: `tiny` (tests, CPU) and `full`, Coqui's own VITS defaults (the
LJSpeech model's shape, 22.05 kHz): its compute, for GPUs. Both use the deterministic
duration predictor, set to a fixed number of frames per symbol, so random weights speak
about as long as a trained model would.
"""

from __future__ import annotations

import math
from pathlib import Path

SAMPLE_RATES = {"tiny": 16_000, "full": 22_050}
FRAMES_PER_SYMBOL = {"tiny": 6.0, "full": 3.0}
"""Spectrogram frames per input symbol (blanks included): `full` about a trained LJSpeech
VITS's speaking rate, about 15 characters a second."""
HOP_LENGTH = 256
CHARACTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 "
PUNCTUATIONS = "!'(),-.:;? "


def build_vits(directory: Path, size: str = "tiny", seed: int = 0) -> tuple[Path, Path]:
    """Write `model.pth` and `config.json` of a random-weight VITS of shape `size`
    (`tiny`, `full`); returns their paths."""
    import torch
    from TTS.tts.configs.shared_configs import BaseAudioConfig, CharactersConfig
    from TTS.tts.configs.vits_config import VitsArgs, VitsConfig
    from TTS.tts.models.vits import Vits

    torch.manual_seed(seed)
    config = VitsConfig(
        use_phonemes=False,
        phoneme_language="en",
        text_cleaner="basic_cleaners",
        add_blank=True,
        characters=CharactersConfig(
            characters_class="TTS.tts.models.vits.VitsCharacters",
            pad="<PAD>",
            eos="<EOS>",
            bos="<BOS>",
            blank="<BLNK>",
            characters=CHARACTERS,
            punctuations=PUNCTUATIONS,
        ),
        audio=BaseAudioConfig(
            sample_rate=SAMPLE_RATES[size], hop_length=HOP_LENGTH, win_length=1024, fft_size=1024
        ),
        model_args=_tiny_args(VitsArgs) if size == "tiny" else _full_args(VitsArgs),
    )
    model = Vits(config)
    with torch.no_grad():
        # A fixed number of frames per symbol, as a trained model speaks, instead of a
        # random duration that rounds up to one frame whatever the speed.
        model.duration_predictor.proj.weight.mul_(0.01)
        model.duration_predictor.proj.bias.fill_(math.log(FRAMES_PER_SYMBOL[size]))
    directory.mkdir(parents=True, exist_ok=True)
    model_path, config_path = directory / "model.pth", directory / "config.json"
    torch.save({"model": model.state_dict()}, model_path)
    config.save_json(str(config_path))
    return model_path, config_path


def build_tiny_vits(directory: Path) -> tuple[Path, Path]:
    return build_vits(directory, "tiny")


def _full_args(args_cls: type) -> object:
    return args_cls(use_sdp=False, init_discriminator=False)


def _tiny_args(args_cls: type) -> object:
    # Upsample rates must multiply to the hop length; resblock type "1" takes three
    # dilations per kernel.
    return args_cls(
        out_channels=513,
        hidden_channels=16,
        hidden_channels_ffn_text_encoder=32,
        num_heads_text_encoder=2,
        num_layers_text_encoder=1,
        num_layers_posterior_encoder=1,
        num_layers_flow=1,
        resblock_type_decoder="1",
        resblock_kernel_sizes_decoder=[3],
        resblock_dilation_sizes_decoder=[[1, 3, 5]],
        upsample_rates_decoder=[8, 8, 4],
        upsample_initial_channel_decoder=32,
        upsample_kernel_sizes_decoder=[16, 16, 8],
        use_sdp=False,
        init_discriminator=False,
    )


XTTS_SPECIAL = ["[STOP]", "[UNK]", "[SPACE]", "[START]", "[en]"]
XTTS_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789.,!?'-"


def build_tiny_xtts(directory: Path, seed: int = 0) -> tuple[Path, Path]:
    """Write a random-weight XTTS checkpoint directory (`model.pth`, `vocab.json`,
    `config.json`); returns the directory and its config.

    The GPT is tiny; the HiFi-GAN decoder and its speaker encoder keep their fixed sizes.
    The stop token is made unlikely, so that every sentence runs to the audio-token limit
    and `inference_stream` yields several chunks of it.
    """
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from TTS.tts.configs.xtts_config import XttsAudioConfig, XttsConfig
    from TTS.tts.models.xtts import Xtts, XttsArgs

    torch.manual_seed(seed)
    directory.mkdir(parents=True, exist_ok=True)
    vocab = {token: i for i, token in enumerate([*XTTS_SPECIAL, *XTTS_CHARS])}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(XTTS_SPECIAL)
    tokenizer.save(str(directory / "vocab.json"))
    args = XttsArgs(
        gpt_layers=1,
        gpt_n_model_channels=64,
        gpt_n_heads=2,
        gpt_number_text_tokens=len(vocab),
        gpt_start_text_token=vocab["[START]"],
        gpt_stop_text_token=vocab["[STOP]"],
        gpt_num_audio_tokens=66,
        gpt_start_audio_token=64,
        gpt_stop_audio_token=65,
        gpt_max_audio_tokens=40,
        gpt_max_text_tokens=200,
        gpt_use_perceiver_resampler=True,
        decoder_input_dim=64,
    )
    config = XttsConfig(model_args=args, audio=XttsAudioConfig(), languages=["en"])
    model = Xtts(config)
    with torch.no_grad():
        model.gpt.mel_head.bias[args.gpt_stop_audio_token] = -30.0
    torch.save({"model": model.state_dict()}, directory / "model.pth")
    config.save_json(str(directory / "config.json"))
    return directory, directory / "config.json"
