// The Talk page's microphone tap, an AudioWorklet module: the context's audio (mono, at
// the context's rate) as pcm16 little-endian, posted in chunks of `samples` samples. It is
// a file of its own because the console's Content-Security-Policy (script-src 'self')
// refuses a worklet module made in the page from a Blob URL.
class Pcm16Chunks extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.samples = options.processorOptions.samples;
    this.chunk = new DataView(new ArrayBuffer(this.samples * 2));
    this.filled = 0;
  }

  process(inputs) {
    const channel = inputs[0][0];
    if (!channel) return true; // no input connected yet
    for (const value of channel) {
      const clipped = Math.max(-1, Math.min(1, value));
      this.chunk.setInt16(this.filled * 2, clipped < 0 ? clipped * 0x8000 : clipped * 0x7fff, true);
      if (++this.filled === this.samples) {
        this.port.postMessage(this.chunk.buffer, [this.chunk.buffer]);
        this.chunk = new DataView(new ArrayBuffer(this.samples * 2));
        this.filled = 0;
      }
    }
    return true;
  }
}

registerProcessor("pcm16-chunks", Pcm16Chunks);
