"""The OpenAI surface: request schemas, sampling fields -> engine sampling params, and the chat
and completions jobs with their renderers (`chat.completion`, `text_completion`)."""
