// redrive web UI: keyboard shortcuts, confirmations, live relative times, a running
// replay job's live progress.
// Progressive enhancement only: every page and form works without this file
// (the server asks for confirmation on a page of its own instead).
"use strict";

(() => {
  const $ = (selector, root = document) => root.querySelector(selector);
  const $$ = (selector, root = document) => Array.from(root.querySelectorAll(selector));

  // ------------------------------------------------------------ relative times

  function span(seconds) {
    let s = Math.floor(Math.abs(seconds));
    if (s < 60) return `${s}s`;
    let m = Math.floor(s / 60);
    s %= 60;
    if (m < 10) return s ? `${m}m ${s}s` : `${m}m`;
    if (m < 60) return `${m}m`;
    let h = Math.floor(m / 60);
    m %= 60;
    if (h < 24) return m ? `${h}h ${m}m` : `${h}h`;
    const d = Math.floor(h / 24);
    h %= 24;
    return h ? `${d}d ${h}h` : `${d}d`;
  }

  function refreshTimes() {
    const now = Date.now();
    for (const el of $$("time[data-rel]")) {
      const at = Date.parse(el.getAttribute("datetime"));
      if (Number.isNaN(at)) continue;
      const delta = (at - now) / 1000;
      el.textContent = Math.abs(delta) < 1 ? "now" : delta > 0 ? `in ${span(delta)}` : `${span(delta)} ago`;
    }
  }

  // ------------------------------------------------------------ confirmation

  function ask(text, okLabel, danger) {
    const dialog = $("#confirm");
    if (!dialog || typeof dialog.showModal !== "function") {
      return Promise.resolve(window.confirm(text));
    }
    $("#confirm-text", dialog).textContent = text;
    const ok = $("[data-ok]", dialog);
    const cancel = $("[data-cancel]", dialog);
    ok.textContent = okLabel || "Confirm";
    ok.className = danger ? "danger" : "primary";
    return new Promise((resolve) => {
      const done = (answer) => {
        ok.onclick = cancel.onclick = dialog.oncancel = null;
        dialog.close();
        resolve(answer);
      };
      ok.onclick = () => done(true);
      cancel.onclick = () => done(false);
      dialog.oncancel = (event) => {
        event.preventDefault();
        done(false);
      };
      dialog.showModal();
      (danger ? cancel : ok).focus();
    });
  }

  function checkedIds(form) {
    return $$('input[name="ids"]:checked', form).length;
  }

  document.addEventListener("submit", (event) => {
    const form = event.target;
    const submitter = event.submitter;
    if (form.method === "get" && form.getAttribute("role") === "search") {
      // Leave empty fields out of the URL: /dead-letters?error_type=X, not seven "&x=".
      const empty = $$("input", form).filter((input) => !input.value);
      for (const input of empty) input.disabled = true;
      setTimeout(() => { for (const input of empty) input.disabled = false; }, 0);
      return;
    }
    // A preview (a dry run) changes nothing: no confirmation, but a selection to show.
    if (submitter && "noConfirm" in submitter.dataset) {
      if ("needsSelection" in submitter.dataset && checkedIds(form) === 0) {
        event.preventDefault();
        showSelection(form, "Select dead letters first: tick their boxes, or press x on a row.");
      }
      return;
    }
    const source = submitter && submitter.dataset.confirm ? submitter : form;
    let text = source.dataset.confirm;
    if (!text) return;
    const flag = $("[data-confirmed]", form);
    if (flag && flag.value === "1") return;
    event.preventDefault();
    if (submitter && "needsSelection" in submitter.dataset) {
      const n = checkedIds(form);
      if (n === 0) {
        showSelection(form, "Select dead letters first: tick their boxes, or press x on a row.");
        return;
      }
      text = text.replace("{n}", n === 1 ? "1" : String(n)).replace("dead letters", n === 1 ? "dead letter" : "dead letters");
    }
    if (text.includes("{dest}")) {
      const input = $("[data-destination]", form);
      const chosen = input && input.value.trim();
      text = text.replace("{dest}", chosen || form.dataset.defaultDest || "its topic");
    }
    const label = source.dataset.confirmButton || (submitter && submitter.textContent.replace(/…$/, "").trim());
    ask(text, label, "danger" in source.dataset).then((yes) => {
      if (!yes) return;
      if (flag) flag.value = "1";
      if (submitter) form.requestSubmit(submitter);
      else form.requestSubmit();
      if (flag) setTimeout(() => { flag.value = "0"; }, 0);
    });
  });

  // ------------------------------------------------------------ selection

  function showSelection(form, message) {
    const out = $("[data-selection-count]", form);
    if (!out) return;
    out.textContent = "";
    if (message) {
      out.textContent = message;
      out.classList.add("flash-error");
      return;
    }
    out.classList.remove("flash-error");
    const n = checkedIds(form);
    if (n === 0) {
      out.textContent = "Tick rows to act on a selection";
      return;
    }
    const strong = document.createElement("strong");
    strong.textContent = String(n);
    out.append(strong, ` selected`);
  }

  document.addEventListener("change", (event) => {
    const box = event.target;
    const form = box.form;
    if (!form || !("bulk" in form.dataset)) return;
    if ("checkAll" in box.dataset) {
      for (const other of $$('input[name="ids"]', form)) other.checked = box.checked;
    }
    showSelection(form);
  });

  // ------------------------------------------------------------ rows

  const table = $("table[data-rows]");
  let current = -1;

  function rows() {
    return table && table.tBodies[0] ? Array.from(table.tBodies[0].rows) : [];
  }

  function select(index) {
    const all = rows();
    if (!all.length) return;
    current = Math.max(0, Math.min(all.length - 1, index));
    all.forEach((row, i) => row.classList.toggle("selected", i === current));
    all[current].scrollIntoView({ block: "nearest" });
  }

  function open(row) {
    const href = row.dataset.href || (row.querySelector("a[href]") || {}).href;
    if (href) window.location.assign(href);
  }

  if (table) {
    table.addEventListener("click", (event) => {
      const row = event.target.closest("tr[data-href]");
      if (!row || event.target.closest("a, input, button, label, select, textarea")) return;
      if (String(window.getSelection() || "")) return;
      open(row);
    });
  }

  // ------------------------------------------------------------ keyboard

  let goPrefix = 0;

  function typing(target) {
    return target.closest && target.closest("input, textarea, select, [contenteditable]");
  }

  function focusSearch() {
    const search = $("[data-search]");
    if (!search) {
      window.location.assign("/dead-letters#search");
      return;
    }
    search.focus();
    search.select();
  }

  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if ($("dialog[open]")) return;
    if (typing(event.target)) {
      if (event.key === "Escape") event.target.blur();
      return;
    }
    const key = event.key;
    if (goPrefix && Date.now() - goPrefix < 1500) {
      goPrefix = 0;
      const to = { o: "/", p: "/pending", d: "/dead-letters", r: "/records", j: "/jobs" }[key];
      if (to) {
        event.preventDefault();
        window.location.assign(to);
        return;
      }
    }
    goPrefix = 0;
    const all = rows();
    switch (key) {
      case "/":
        event.preventDefault();
        focusSearch();
        break;
      case "?":
        event.preventDefault();
        $("#shortcuts").showModal();
        break;
      case "g":
        goPrefix = Date.now();
        break;
      case "j":
      case "ArrowDown":
        if (!all.length || (key === "ArrowDown" && current < 0)) return;
        event.preventDefault();
        select(current + 1);
        break;
      case "k":
      case "ArrowUp":
        if (!all.length || (key === "ArrowUp" && current < 0)) return;
        event.preventDefault();
        select(current < 0 ? 0 : current - 1);
        break;
      case "Enter":
        if (current < 0 || !all[current] || event.target.closest("a, button")) return;
        event.preventDefault();
        open(all[current]);
        break;
      case "x": {
        if (current < 0 || !all[current]) return;
        const box = all[current].querySelector('input[type="checkbox"]');
        if (!box) return;
        event.preventDefault();
        box.checked = !box.checked;
        box.dispatchEvent(new Event("change", { bubbles: true }));
        break;
      }
      default:
    }
  });

  // ------------------------------------------------------------ replay job progress

  // A running job's page follows the job until it ends: the page's own JSON route
  // (/jobs/{id}.json, read with the session cookie as the page was; the REST API
  // takes bearer tokens only), one request at a time, every half second.
  const POLL_MS = 500;

  function utc(iso) {
    const at = new Date(iso);
    return Number.isNaN(at.getTime()) ? null : at;
  }

  function showFinished(cell, iso) {
    const at = utc(iso);
    if (!cell || !at) return;
    const absolute = `${at.toISOString().slice(0, 19).replace("T", " ")} UTC`;
    const time = document.createElement("time");
    time.dateTime = at.toISOString();
    time.title = absolute;
    time.dataset.rel = "";
    const abs = document.createElement("span");
    abs.className = "abs";
    abs.textContent = absolute;
    cell.replaceChildren(time, document.createElement("br"), abs);
    refreshTimes();
  }

  function showJob(root, job) {
    const badge = $("[data-job-state]", root);
    if (badge) {
      badge.textContent = job.state;
      badge.className = `badge badge-job-${job.state}`;
    }
    const bar = $("[data-job-bar]", root);
    if (bar) {
      bar.max = job.total;
      bar.value = job.worked;
      bar.textContent = `${job.percent}%`;
    }
    const percent = $("[data-job-percent]", root);
    if (percent) percent.textContent = `${job.percent}%`;
    for (const count of $$("[data-job-count]", root)) {
      count.textContent = Number(job[count.dataset.jobCount]).toLocaleString("en-US");
    }
    const summary = $("[data-job-summary]", root);
    if (summary && summary.textContent !== job.summary) summary.textContent = job.summary;
    if (job.state === "running" || job.state === "scheduled") return;
    root.dataset.state = job.state;
    // The live region was busy while the job ran: screen readers now read the outcome.
    if (summary) summary.setAttribute("aria-busy", "false");
    for (const element of $$("[data-job-while-running]", root)) element.hidden = true;
    showFinished($("[data-job-finished]", root), job.finished_at);
    const cancelledBy = $("[data-job-cancelled-by]", root);
    if (cancelledBy && job.cancelled_by) {
      $("[data-job-cancelled-by-name]", cancelledBy).textContent = job.cancelled_by;
      cancelledBy.hidden = false;
    }
  }

  function followJob(root) {
    const url = `/jobs/${encodeURIComponent(root.dataset.job)}.json`;
    const failuresShown = Number(root.dataset.failures || 0);
    const poll = () => {
      if (document.hidden) {
        // Not from a tab nobody looks at: go on when it is shown again.
        document.addEventListener("visibilitychange", poll, { once: true });
        return;
      }
      fetch(url, { credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" } })
        .then((response) => {
          // Sent to sign in (the session ended) or the job is gone: stop following.
          if (!response.ok || response.redirected) return null;
          return response.json();
        })
        .then((job) => {
          if (!job) return;
          showJob(root, job);
          // A scheduled job is followed too: it starts on its own, at its time.
          if (job.state === "running" || job.state === "scheduled") setTimeout(poll, POLL_MS);
          // The refusals are listed by the server: reload once to show them.
          else if (job.failures.length > failuresShown) window.location.reload();
        })
        .catch(() => setTimeout(poll, 4 * POLL_MS)); // the service did not answer: later
    };
    setTimeout(poll, POLL_MS);
  }

  // ------------------------------------------------------------ start

  for (const button of $$("[data-shortcuts]")) {
    button.addEventListener("click", () => $("#shortcuts").showModal());
  }
  for (const link of $$("a[data-back]")) {
    link.addEventListener("click", (event) => {
      if (window.history.length > 1) {
        event.preventDefault();
        window.history.back();
      }
    });
  }
  for (const form of $$("form[data-bulk]")) showSelection(form);
  const job = $("[data-job]");
  if (job && (job.dataset.state === "running" || job.dataset.state === "scheduled")) followJob(job);
  if (window.location.hash === "#search") focusSearch();
  refreshTimes();
  setInterval(refreshTimes, 1000);
})();
