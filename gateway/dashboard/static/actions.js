// The dashboard's forms: copy a new key, confirm before a destructive action, and send an
// adapter upload with a progress bar, showing the server's refusal beside the form. Every form
// also works without this script (a plain POST answered by a page).
"use strict";
(function () {
  // The page that shows a new key answers a POST: make a reload fetch the keys page instead of
  // sending the form again (which would make another key).
  var back = document.getElementById("new-key-done");
  if (back && window.history.replaceState) window.history.replaceState(null, "", back.getAttribute("href"));

  document.querySelectorAll("button[data-copy]").forEach(function (button) {
    var field = document.getElementById(button.getAttribute("data-copy"));
    var status = document.getElementById("copy-status");
    button.addEventListener("click", function () {
      var said = function (text) { if (status) status.textContent = text; };
      field.select();
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(field.value).then(
          function () { said("Copied to the clipboard."); },
          function () { said("Could not copy: select the key and copy it by hand."); });
      } else {
        said(document.execCommand("copy") ? "Copied to the clipboard." : "Select the key and copy it by hand.");
      }
    });
  });

  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.getAttribute("data-confirm"))) event.preventDefault();
    });
  });

  var upload = document.getElementById("upload-form");
  if (!upload) return;
  var row = document.getElementById("upload-progress");
  var bar = document.getElementById("upload-bar");
  var percent = document.getElementById("upload-percent");
  var error = document.getElementById("upload-error");
  var button = document.getElementById("upload-button");
  function fail(message) {
    error.textContent = message;
    error.hidden = false;
    row.hidden = true;
    button.disabled = false;
  }
  upload.addEventListener("submit", function (event) {
    event.preventDefault();
    var xhr = new XMLHttpRequest();
    xhr.open("POST", upload.getAttribute("action"));
    xhr.setRequestHeader("Accept", "application/json");
    xhr.upload.onprogress = function (e) {
      if (!e.lengthComputable) return;
      var p = Math.round((e.loaded / e.total) * 100);
      bar.value = p;
      percent.textContent = p === 100 ? "100%: checking the adapter…" : p + "%";
    };
    xhr.onload = function () {
      if (xhr.status === 201) { window.location.assign(upload.getAttribute("data-done")); return; }
      var message = null;
      try { message = JSON.parse(xhr.responseText).error.message; } catch (e) { message = null; }
      fail(message || "The upload did not complete (your session may have ended): reload the page and try again.");
    };
    xhr.onerror = function () { fail("The upload did not reach the server: check the connection and try again."); };
    error.hidden = true;
    error.textContent = "";
    bar.value = 0;
    percent.textContent = "0%";
    row.hidden = false;
    button.disabled = true;
    xhr.send(new FormData(upload));
  });
})();
