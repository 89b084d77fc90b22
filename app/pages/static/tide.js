// TIDE pages: live regions, job actions and the submit form. Plain JavaScript, no library.
// Every change goes through the JSON API; the session cookie authenticates it and the page's
// CSRF token (meta csrf-token) proves the request comes from our own page.
(function () {
  "use strict";

  var csrfMeta = document.querySelector('meta[name="csrf-token"]');
  var csrf = csrfMeta ? csrfMeta.content : "";

  function signInAgain() {
    window.location.assign("/ui/login?next=" + encodeURIComponent(window.location.pathname));
  }

  // Call the JSON API. Resolves with the parsed body; rejects with the API's {code, message, param}.
  async function api(method, url, body) {
    var headers = { "Accept": "application/json", "X-CSRF-Token": csrf };
    var payload;
    if (body instanceof FormData) {
      payload = body;
    } else if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      payload = JSON.stringify(body);
    }
    var response;
    try {
      response = await fetch(url, { method: method, headers: headers, body: payload, credentials: "same-origin" });
    } catch (err) {
      throw { code: "network_error", message: "the server could not be reached (" + err.message + "); check the connection and try again", param: null };
    }
    if (response.status === 401) {
      signInAgain();
      throw { code: "unauthorized", message: "your session has ended; signing in again", param: null };
    }
    var data = null;
    if (response.status !== 204) {
      try { data = await response.json(); } catch (err) { data = null; }
    }
    if (!response.ok) {
      throw (data && data.error) || { code: "http_" + response.status, message: "the server answered HTTP " + response.status, param: null };
    }
    return data;
  }

  // ---- live regions: a server-rendered fragment, re-fetched while something runs ------------
  function startLive(region) {
    var url = region.dataset.live;
    function delayFor(el) {
      if (el.dataset.active === "true") return 1500;
      return el.dataset.idlePoll ? Number(el.dataset.idlePoll) : 0;
    }
    async function tick() {
      try {
        var response = await fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } });
        if (response.redirected || response.status === 401) { signInAgain(); return; }
        if (response.ok) {
          var holder = document.createElement("template");
          holder.innerHTML = (await response.text()).trim();
          var fresh = holder.content.querySelector("[data-live]");
          if (fresh) {
            region.replaceWith(fresh);
            region = fresh;
          }
        }
      } catch (err) {
        // a dropped poll is retried on the next tick
      }
      schedule();
    }
    var timer = null;
    function schedule() {
      var delay = delayFor(region);
      if (delay) timer = window.setTimeout(tick, delay);
    }
    schedule();
    return {
      current: function () { return region; },
      refresh: function () { window.clearTimeout(timer); tick(); },
    };
  }

  var liveRegions = Array.prototype.map.call(document.querySelectorAll("[data-live]"), startLive);

  function say(message) {
    var status = document.getElementById("action-status");
    if (!status) return;
    status.textContent = message;
    status.hidden = !message;
  }

  // ---- buttons: cancel, delete, copy ---------------------------------------------------------
  document.addEventListener("click", async function (event) {
    var button = event.target.closest("button[data-action]");
    if (button) {
      if (button.dataset.confirm && !window.confirm(button.dataset.confirm)) return;
      button.disabled = true;
      try {
        await api(button.dataset.method || "POST", button.dataset.url);
        if (button.dataset.then) {
          window.location.assign(button.dataset.then);
          return;
        }
        say(button.dataset.action === "cancel" ? "Cancel requested: the job stops at its next check." : "Done.");
        // Cancelling flips the live region back on even if it had stopped polling.
        liveRegions.forEach(function (live) { live.current().dataset.active = "true"; live.refresh(); });
      } catch (error) {
        say("Error: " + error.message);
        button.disabled = false;
      }
      return;
    }
    var copy = event.target.closest("button[data-copy]");
    if (copy) {
      var source = document.querySelector(copy.dataset.copy);
      try {
        await navigator.clipboard.writeText(source.textContent);
        copy.textContent = "Copied";
      } catch (err) {
        window.getSelection().selectAllChildren(source);
        copy.textContent = "Selected: press Ctrl+C";
      }
    }
  });

  // ---- the submit form -----------------------------------------------------------------------
  var form = document.getElementById("new-job");
  if (!form) return;

  function setPath(target, path, value) {
    var parts = path.split(".");
    var node = target;
    for (var i = 0; i < parts.length - 1; i++) {
      if (typeof node[parts[i]] !== "object" || node[parts[i]] === null) node[parts[i]] = {};
      node = node[parts[i]];
    }
    node[parts[parts.length - 1]] = value;
  }

  // Numbers are sent as numbers when they read as one; anything else is sent as typed, so the
  // server (the one place options are checked) names what is wrong with it.
  function convert(raw, kind) {
    if (kind === "integer" && /^[-+]?\d+$/.test(raw)) return Number(raw);
    if (kind === "number" && raw !== "" && isFinite(Number(raw))) return Number(raw);
    if (kind === "json") { try { return JSON.parse(raw); } catch (err) { return raw; } }
    return raw;
  }

  function clearErrors() {
    form.querySelectorAll(".field-error").forEach(function (el) { el.hidden = true; el.textContent = ""; });
    form.querySelectorAll("[aria-invalid]").forEach(function (el) { el.removeAttribute("aria-invalid"); });
    form.querySelectorAll(".field.invalid").forEach(function (el) { el.classList.remove("invalid"); });
  }

  // The element an error's `param` names: the field itself, the field of a list item
  // (terms[3] -> terms), or the group (training.x -> training).
  function fieldFor(param) {
    if (!param) return null;
    var candidates = [param, param.replace(/\[\d+\]/g, "")];
    var parts = candidates[1].split(".");
    while (parts.length > 1) { parts.pop(); candidates.push(parts.join(".")); }
    for (var i = 0; i < candidates.length; i++) {
      var name = candidates[i];
      var found = Array.prototype.find.call(form.querySelectorAll("[data-param]"), function (el) {
        return el.classList.contains("field") && (el.dataset.param === name || el.dataset.paramAlias === name);
      }) || form.querySelector('details[data-param="' + CSS.escape(name) + '"]');
      if (found) return found;
    }
    return null;
  }

  function showError(error) {
    var field = fieldFor(error.param);
    var summary = document.getElementById("form-error");
    var where = error.param ? " (" + error.param + ")" : "";
    summary.innerHTML = "";
    var strong = document.createElement("strong");
    strong.textContent = "Not started:";
    summary.appendChild(strong);
    summary.appendChild(document.createTextNode(" " + error.message + where));
    summary.hidden = false;
    if (!field) { summary.scrollIntoView({ block: "center" }); return; }
    var details = field.closest("details");
    if (details) details.open = true;
    var box = field.tagName === "DETAILS" ? null : field.querySelector(".field-error");
    if (box) {
      box.textContent = "";
      var label = document.createElement("strong");
      label.textContent = "Error:";
      box.appendChild(label);
      box.appendChild(document.createTextNode(" " + error.message));
      box.hidden = false;
      field.classList.add("invalid");
    }
    var input = field.querySelector("input, textarea, select");
    if (input) {
      input.setAttribute("aria-invalid", "true");
      input.focus({ preventScroll: true });
    }
    field.scrollIntoView({ block: "center" });
  }

  async function readTerms() {
    var lines = form.elements.terms_text.value.split(/\r?\n/);
    var file = form.elements.terms_file.files[0];
    if (file) lines = lines.concat((await file.text()).replace(/^\uFEFF/, "").split(/\r?\n/));
    return lines.map(function (line) { return line.trim(); }).filter(Boolean);
  }

  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    clearErrors();
    document.getElementById("form-error").hidden = true;
    var submit = document.getElementById("submit-job");
    var busy = document.getElementById("form-busy");
    submit.disabled = true;
    busy.hidden = false;
    try {
      var body = {};
      var baseModel = form.elements.base_model.value.trim();
      if (baseModel) body.base_model = baseModel;
      var terms = await readTerms();
      if (terms.length || form.elements.terms_file.files.length) body.terms = terms;
      var corpus = form.elements.corpus_file.files[0];
      var textField = form.querySelector('[data-param="corpus_text_field"][data-option]');
      if (corpus) {
        busy.textContent = "Uploading the corpus…";
        var upload = new FormData();
        upload.append("file", corpus);
        if (textField && textField.value.trim()) upload.append("text_field", textField.value.trim());
        body.corpus_file_id = (await api("POST", "/files", upload)).id;
      } else if (form.elements.corpus_text && form.elements.corpus_text.value.trim()) {
        body.corpus_text = form.elements.corpus_text.value;
      }
      form.querySelectorAll("[data-option]").forEach(function (input) {
        if (input.type === "checkbox") { setPath(body, input.dataset.param, input.checked); return; }
        var raw = input.value.trim();
        if (raw !== "") setPath(body, input.dataset.param, convert(raw, input.dataset.type));
      });
      busy.textContent = "Starting the job…";
      var job = await api("POST", "/extend", body);
      window.location.assign("/ui/jobs/" + encodeURIComponent(job.id));
    } catch (error) {
      showError(error && error.message ? error : { message: String(error), param: null });
      submit.disabled = false;
      busy.hidden = true;
    }
  });
})();
