// batchyard dashboard: drag-and-drop upload, upload progress, copy buttons, relative times.
// Everything else is htmx; this file only covers what attributes cannot.
(function () {
  "use strict";

  function formatBytes(n) {
    if (n < 1024) return n + " B";
    var units = ["KB", "MB", "GB"], v = n / 1024, i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return v.toFixed(1) + " " + units[i];
  }

  function uploadForm() { return document.getElementById("upload-form"); }

  // A sheet (.csv, .tsv, .xlsx) is stored as user_data and opens the sheet form; anything
  // else is a batch input file.
  function setPurpose(form, file) {
    var sheet = /\.(csv|tsv|xlsx)$/i.test(file.name);
    form.querySelector("input[name=purpose]").value = sheet ? "user_data" : "batch";
  }

  // Put the file into the form's input and let htmx send it (one path for drop and button).
  function submitFile(file) {
    var form = uploadForm();
    if (!form || !file) return;
    var input = form.querySelector("input[type=file]");
    var dt = new DataTransfer();
    dt.items.add(file);
    input.files = dt.files;
    setPurpose(form, file);
    htmx.trigger(form, "submit");
  }

  // The whole page accepts a drop; a counter keeps the overlay steady over child elements.
  var depth = 0;
  function hasFiles(e) {
    return e.dataTransfer && Array.prototype.indexOf.call(e.dataTransfer.types || [], "Files") >= 0;
  }
  document.addEventListener("dragenter", function (e) {
    if (!document.body.hasAttribute("data-dropzone") || !hasFiles(e)) return;
    e.preventDefault();
    depth++;
    document.body.classList.add("dragging");
  });
  document.addEventListener("dragover", function (e) {
    if (!document.body.hasAttribute("data-dropzone") || !hasFiles(e)) return;
    e.preventDefault();
    e.dataTransfer.dropEffect = "copy";
  });
  document.addEventListener("dragleave", function () {
    depth = Math.max(0, depth - 1);
    if (depth === 0) document.body.classList.remove("dragging");
  });
  document.addEventListener("drop", function (e) {
    if (!document.body.hasAttribute("data-dropzone")) return;
    e.preventDefault();
    depth = 0;
    document.body.classList.remove("dragging");
    var files = e.dataTransfer && e.dataTransfer.files;
    if (!files || !files.length) return;
    if (!uploadForm()) {
      // A preview is showing: go back to the upload form, then send the new file.
      htmx.ajax("GET", "/web/upload", { target: "#upload-zone" }).then(function () { submitFile(files[0]); });
      return;
    }
    submitFile(files[0]);
  });

  document.addEventListener("click", function (e) {
    var choose = e.target.closest("[data-choose-file]");
    if (choose) {
      var input = choose.closest("form").querySelector("input[type=file]");
      input.click();
      return;
    }
    var copy = e.target.closest("[data-copy]");
    if (copy) {
      var text = document.querySelector(copy.getAttribute("data-copy")).innerText;
      var done = function () { copy.textContent = "Copied"; setTimeout(function () { copy.textContent = "Copy"; }, 1500); };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(done);
      } else {
        var area = document.createElement("textarea");
        area.value = text; document.body.appendChild(area); area.select();
        document.execCommand("copy"); area.remove(); done();
      }
    }
  });

  document.addEventListener("change", function (e) {
    if (e.target.matches("#upload-form input[type=file]") && e.target.files.length) {
      setPurpose(e.target.form, e.target.files[0]);
      htmx.trigger(e.target.form, "submit");
    }
  });

  // Upload progress: htmx forwards the XHR's upload progress events.
  document.addEventListener("htmx:xhr:progress", function (e) {
    var form = e.target.closest && e.target.closest("#upload-form");
    if (!form || !e.detail.lengthComputable) return;
    var box = form.querySelector(".upload-progress");
    box.hidden = false;
    form.querySelector("progress").value = (100 * e.detail.loaded) / e.detail.total;
    form.querySelector("#upload-bytes").textContent =
      formatBytes(e.detail.loaded) + " of " + formatBytes(e.detail.total) + " sent";
  });
  document.addEventListener("htmx:beforeRequest", function (e) {
    if (e.target.id === "upload-form") {
      var box = e.target.querySelector(".upload-progress");
      box.hidden = false;
      e.target.querySelector("#upload-bytes").textContent = "Uploading…";
    }
  });

  // A request htmx could not swap in (a 5xx, the server gone): say so instead of doing nothing.
  function flash(text) {
    var box = document.getElementById("flash");
    if (!box) {
      box = document.createElement("p");
      box.id = "flash";
      box.className = "alert flash";
      box.setAttribute("role", "alert");
      document.getElementById("main").prepend(box);
    }
    box.textContent = text;
  }
  document.addEventListener("htmx:responseError", function (e) {
    var text = "The server answered " + e.detail.xhr.status + ".";
    try { text = JSON.parse(e.detail.xhr.responseText).error.message || text; } catch (_) { /* not JSON */ }
    flash(text);
  });
  document.addEventListener("htmx:sendError", function () {
    flash("The server could not be reached. Is batchyard still running?");
  });

  // Relative times ("3 min ago") stay true while the page is open; the exact time is the title.
  // The same thresholds as relative() in app/web/views.py, which renders the first text.
  function relative(iso) {
    var s = (Date.parse(iso) - Date.now()) / 1000, future = s > 0, a = Math.abs(s), n, unit;
    if (a < 45) return future ? "in a few seconds" : "just now";
    if (a < 3600 * 0.75) { n = Math.max(1, Math.round(a / 60)); unit = "min"; }
    else if (a < 86400 * 0.75) { n = Math.round(a / 3600); unit = "h"; }
    else { n = Math.round(a / 86400); unit = "d"; }
    return future ? "in " + n + " " + unit : n + " " + unit + " ago";
  }
  setInterval(function () {
    document.querySelectorAll("time[data-relative]").forEach(function (t) {
      t.textContent = relative(t.getAttribute("datetime"));
    });
  }, 30000);
})();
