// The voxgate voice-agent page: one WebRTC call (mic up, the agent's voice down, an "events"
// data channel of JSON) and what the call's events say: the conversation and its latency.
// `window.voxgate` exposes the call's state for tests (call id, events, received audio).
"use strict";

const $ = (id) => document.getElementById(id);
const key = new URLSearchParams(location.search).get("key"); // for a server with VOXGATE_API_KEYS
const STAGES = { // latest-turn rows: [from mark, to mark], in ms from end of turn (vad_end)
  stt: ["vad_end", "stt_done"], llm: ["stt_done", "llm_first_token"], segment: ["llm_first_token", "first_segment"],
  tts: ["first_segment", "tts_first_audio"], publish: ["tts_first_audio", "first_frame_published"],
  eot: ["vad_end", "first_frame_published"],
};

const page = window.voxgate = { callId: null, state: "idle", events: [], eot: [], audio: { energy: 0, bytes: 0, peak: 0 } };
let call = null; // { pc, channel, mic, context, timer }
const entries = new Map(); // "user:<trace_id>" / "agent:<trace_id>" -> <li>

function show(state, text) {
  page.state = state;
  $("status").dataset.state = state;
  $("status").textContent = text || state;
}

function percentile(values, q) { // linear interpolation, as `voxgate agent --report`
  const v = [...values].sort((a, b) => a - b);
  const pos = (v.length - 1) * q / 100, lo = Math.floor(pos), hi = Math.ceil(pos);
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

const ms = (x) => (x === undefined || Number.isNaN(x) ? "\u2013" : `${Math.round(x)} ms`);

function entry(who, trace) {
  const id = `${who}:${trace}`;
  if (!entries.has(id)) {
    const li = document.createElement("li");
    li.className = who;
    li.append(document.createElement("span"));
    $("log").append(li);
    entries.set(id, li);
  }
  return entries.get(id);
}

function say(who, trace, text) {
  const span = entry(who, trace).firstChild;
  span.textContent = [span.textContent, text].filter(Boolean).join(" ");
  $("log").lastChild?.scrollIntoView({ block: "end" });
}

function note(who, trace, text) {
  const li = entry(who, trace), tag = document.createElement("span");
  tag.className = "note";
  tag.textContent = text;
  li.append(tag);
}

function latency(marks) {
  if (marks.first_frame_published === undefined) return;
  page.eot.push(marks.first_frame_published);
  $("eot-p50").textContent = ms(percentile(page.eot, 50));
  $("eot-p95").textContent = ms(percentile(page.eot, 95));
  $("eot-n").textContent = String(page.eot.length);
  for (const [stage, [from, to]] of Object.entries(STAGES)) {
    document.querySelector(`#breakdown [data-stage="${stage}"] td`).textContent = ms(marks[to] - marks[from]);
  }
}

function onEvent(message) {
  page.events.push(message);
  const trace = message.trace_id;
  switch (message.type) {
    case "call.started":
      document.querySelector('#breakdown [data-stage="hangover"] td').textContent = ms(message.vad_hangover_ms);
      return show("listening");
    case "turn.start": return show("hearing you");
    case "turn.end": return show("transcribing");
    case "transcript": return say("user", trace, message.text);
    case "reply.start": entry("agent", trace); return show("thinking");
    case "reply.segment": say("agent", trace, message.text); return show("speaking");
    case "reply.end":
      if (message.status !== "completed") {
        entry("agent", trace).classList.add("cut");
        note("agent", trace, message.status);
      }
      return show("listening");
    case "turn.dropped":
      if (entries.has(`user:${trace}`)) note("user", trace, `(${message.reason}: no reply)`);
      return call && show("listening");
    case "turn.trace": return latency(message.marks);
  }
}

async function waitForIce(pc) { // no trickle: the offer goes with every candidate in it
  if (pc.iceGatheringState === "complete") return;
  await new Promise((resolve) => {
    pc.addEventListener("icegatheringstatechange", () => pc.iceGatheringState === "complete" && resolve());
    setTimeout(resolve, 3000); // host candidates come at once; don't wait forever for others
  });
}

async function api(method, path, body) {
  const headers = { "content-type": "application/json" };
  if (key) headers.authorization = `Bearer ${key}`;
  const reply = await fetch(path, { method, headers, body: body && JSON.stringify(body) });
  const data = await reply.json().catch(() => ({}));
  if (!reply.ok) throw new Error(data.error ? `${data.error.code}: ${data.error.message}` : `HTTP ${reply.status}`);
  return data;
}

function listen(stream) { // the agent's voice: a level meter, and for tests its peak
  const context = new AudioContext();
  const analyser = context.createAnalyser();
  analyser.fftSize = 1024;
  context.createMediaStreamSource(stream).connect(analyser);
  const samples = new Float32Array(analyser.fftSize);
  call.context = context;
  call.meter = setInterval(() => {
    analyser.getFloatTimeDomainData(samples);
    const rms = Math.sqrt(samples.reduce((sum, x) => sum + x * x, 0) / samples.length);
    page.audio.peak = Math.max(page.audio.peak, rms);
    $("level").style.width = `${Math.min(100, rms * 400)}%`;
  }, 50);
}

async function poll(pc) { // received audio per the WebRTC stats (silence counts bytes, not energy)
  const stats = await pc.getStats();
  stats.forEach((s) => {
    if (s.type === "inbound-rtp" && s.kind === "audio") {
      page.audio.bytes = s.bytesReceived || 0;
      page.audio.energy = s.totalAudioEnergy || 0;
    }
  });
}

async function start() {
  $("call").disabled = true;
  show("connecting");
  const mic = await navigator.mediaDevices.getUserMedia({ audio: { echoCancellation: true } });
  const pc = new RTCPeerConnection();
  const channel = pc.createDataChannel("events");
  call = { pc, channel, mic };
  channel.onmessage = (e) => onEvent(JSON.parse(e.data));
  channel.onclose = () => stop("the server hung up"); // after our own stop, `call` is gone: no-op
  mic.getTracks().forEach((track) => pc.addTrack(track, mic));
  pc.ontrack = (e) => {
    const stream = e.streams[0] || new MediaStream([e.track]);
    $("remote").srcObject = stream; // Chrome feeds a remote stream to Web Audio only while a media element plays it
    listen(stream);
  };
  pc.onconnectionstatechange = () => ["failed", "closed"].includes(pc.connectionState) && stop("call lost");
  await pc.setLocalDescription(await pc.createOffer());
  await waitForIce(pc);
  const answer = await api("POST", "/v1/agent/offer", { sdp: pc.localDescription.sdp, type: "offer" });
  page.callId = answer.call_id;
  await pc.setRemoteDescription({ sdp: answer.sdp, type: answer.type });
  call.timer = setInterval(() => poll(pc), 250);
  $("call").textContent = "Hang up";
  $("call").classList.add("live");
  $("call").disabled = false;
}

async function stop(reason) {
  if (!call) return;
  const { pc, mic, context, timer, meter } = call;
  call = null;
  clearInterval(timer);
  clearInterval(meter);
  await poll(pc).catch(() => {});
  if (page.callId) await api("DELETE", `/v1/agent/${page.callId}`).catch(() => {}); // gone already: fine
  pc.close();
  mic.getTracks().forEach((track) => track.stop());
  context?.close();
  $("call").textContent = "Start call";
  $("call").classList.remove("live");
  $("call").disabled = false;
  show("ended", reason ? `ended (${reason})` : "ended");
}

$("call").addEventListener("click", () => {
  const action = call ? stop() : start();
  action.catch(async (error) => {
    await stop().catch(() => {});
    show("error", String(error.message || error));
    $("call").disabled = false;
  });
});
